/**
 * Recurring work, declared in code beside its tasks:
 * - purge files that were soft-deleted more than 30 days ago, nightly at
 *   03:00 Berlin time;
 * - check every customer domain's DNS every 15 minutes: one scheduled task
 *   fans out one check per domain, so a slow or failing domain retries alone.
 *
 * Run it with the worker (the CLI loads `tasks` and `schedules` from here):
 *
 *   DATABASE_URL=postgres://... node --import tsx bin/outlive.js worker --tasks examples/schedules.ts
 *
 * or call `enqueueDue(pool, schedules)` and `tick(pool, { tasks })` from a
 * platform's cron handler. The handlers work on two example tables of the
 * app, in the same database as outlive's rows (`createExampleTables`).
 */
import { lookup } from 'node:dns/promises';
import pg from 'pg';
import { z } from 'zod';
import { defineSchedule, defineTask, enqueueMany } from 'outlive';

let pool: pg.Pool | undefined;

/** Points the handlers at a pool; by default they open one on DATABASE_URL when first needed. */
export function useAppDb(p: pg.Pool): void {
  pool = p;
}

function appDb(): pg.Pool {
  if (!pool) {
    if (!process.env.DATABASE_URL) throw new Error('examples/schedules.ts: set DATABASE_URL to the database of the example tables');
    pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4 });
  }
  return pool;
}

/** Creates the example's tables: files that can be soft-deleted, and customer domains with their DNS status. */
export async function createExampleTables(db: pg.Pool): Promise<void> {
  await db.query(`
    CREATE TABLE IF NOT EXISTS files (
      id bigserial PRIMARY KEY,
      name text NOT NULL,
      deleted_at timestamptz
    );
    CREATE INDEX IF NOT EXISTS files_deleted_at_idx ON files (deleted_at) WHERE deleted_at IS NOT NULL;
    CREATE TABLE IF NOT EXISTS customer_domains (
      id bigserial PRIMARY KEY,
      customer_id bigint NOT NULL,
      domain text NOT NULL UNIQUE,
      -- The address the domain must point at to reach the app.
      expected_address text NOT NULL,
      dns_ok boolean,
      dns_checked_at timestamptz,
      dns_error text
    );`);
}

const PURGE_BATCH = 1_000;

/**
 * Deletes files soft-deleted before `deletedBefore`, a thousand at a time so
 * a big backlog never holds one long lock. A real app would also delete each
 * file's blob from object storage before its row.
 */
export const purgeDeletedFiles = defineTask({
  name: 'purge-deleted-files',
  input: z.object({ deletedBefore: z.iso.datetime() }),
  // Fits a serverless pass (30 s by default); a backlog bigger than one run
  // can purge is finished by the retry, which carries on where it stopped.
  timeoutMs: 20_000,
  async run({ deletedBefore }, ctx) {
    let purged = 0;
    for (;;) {
      // Stop between batches when the worker is shutting down: what is left is purged next night.
      if (ctx.signal.aborted) break;
      const { rowCount } = await appDb().query(
        `DELETE FROM files WHERE id IN (
           SELECT id FROM files WHERE deleted_at < $1 ORDER BY deleted_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
        [deletedBefore, PURGE_BATCH],
      );
      purged += rowCount ?? 0;
      if ((rowCount ?? 0) < PURGE_BATCH) break;
    }
    return { purged };
  },
});

/** Checks one domain: does it resolve to the address the app expects? Stores the answer on its row. */
export const checkDomainDns = defineTask({
  name: 'check-domain-dns',
  input: z.object({ domainId: z.number().int() }),
  timeoutMs: 10_000,
  retry: { maxAttempts: 3, backoff: { baseMs: 30_000 } },
  async run({ domainId }) {
    const { rows } = await appDb().query<{ domain: string; expected_address: string }>(
      'SELECT domain, expected_address FROM customer_domains WHERE id = $1',
      [domainId],
    );
    const row = rows[0];
    if (!row) return { skipped: 'the domain was removed' };
    let ok: boolean;
    let error: string | null = null;
    try {
      const addresses = (await lookup(row.domain, { all: true })).map((a) => a.address);
      ok = addresses.includes(row.expected_address);
      if (!ok) error = `resolves to ${addresses.join(', ')}, not ${row.expected_address}`;
    } catch (err) {
      const code = (err as { code?: string }).code;
      // A name that does not exist is an answer; a resolver that timed out is not: retry that.
      if (code !== 'ENOTFOUND' && code !== 'ENODATA') throw err;
      ok = false;
      error = `${row.domain} does not resolve (${code})`;
    }
    await appDb().query('UPDATE customer_domains SET dns_ok = $2, dns_error = $3, dns_checked_at = now() WHERE id = $1', [
      domainId,
      ok,
      error,
    ]);
    return { domain: row.domain, ok };
  },
});

/**
 * Enqueues one {@link checkDomainDns} per customer domain, in one transaction.
 * The key skips a domain whose previous check is still pending or running.
 */
export const checkAllDomainsDns = defineTask({
  name: 'check-all-domains-dns',
  input: z.object({}),
  timeoutMs: 20_000,
  async run() {
    const client = await appDb().connect();
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<{ id: string }>('SELECT id::text FROM customer_domains ORDER BY id');
      const checks = await enqueueMany(
        client,
        checkDomainDns,
        rows.map((r) => ({ domainId: Number(r.id) })),
        { key: (i) => `domain:${i.domainId}` },
      );
      await client.query('COMMIT');
      return { domains: rows.length, enqueued: checks.filter((c) => !c.deduplicated).length };
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    } finally {
      client.release();
    }
  },
});

const DAY_MS = 86_400_000;

/** Nightly at 03:00 Berlin time: purge what was deleted more than 30 days before the slot. */
export const nightlyPurge = defineSchedule({
  name: 'purge-deleted-files-nightly',
  cron: '0 3 * * *',
  timezone: 'Europe/Berlin',
  task: purgeDeletedFiles,
  // From the slot, not the clock: a late or repeated run purges the same set.
  input: (slot) => ({ deletedBefore: new Date(slot.getTime() - 30 * DAY_MS).toISOString() }),
});

/** Every 15 minutes: check every customer domain's DNS. After downtime, one check is enough. */
export const domainDnsEvery15Minutes = defineSchedule({
  name: 'check-domains-dns',
  cron: '*/15 * * * *',
  task: checkAllDomainsDns,
  input: {},
  missed: 'latest',
});

/** The tasks the worker runs. */
export const tasks = [purgeDeletedFiles, checkAllDomainsDns, checkDomainDns];

/** The schedules the worker's clock (or a platform cron) fires. */
export const schedules = [nightlyPurge, domainDnsEvery15Minutes];
