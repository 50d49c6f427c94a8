/**
 * Migrate: bring the `outlive` schema up to date, from the SQL files that
 * drizzle-kit generated into `db/migrations`.
 *
 * The files are applied as drizzle's migrator applies them, into the same
 * table (`outlive.migrations`: a hash and the journal's `when` per file), so
 * a database migrated by earlier releases, which used drizzle's migrator,
 * goes on from where it is. It is done here so that an app need not have
 * drizzle-orm (an optional peer) to migrate.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { checkWhole } from '../model/checks.js';

/** Where the migrations ship, beside the compiled or source tree. */
export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../db/migrations', import.meta.url)).replace(
  /[\\/]dist[\\/]db[\\/]migrations$/,
  '/db/migrations',
);

// Any fixed number works, as long as no other code takes this advisory lock.
export const MIGRATION_LOCK = 0x6f75746c; // "outl"

/** Options of {@link migrate}. */
export interface MigrateOptions {
  /** How long to wait for another migrate's lock before failing with what to do. Default 60 s. */
  lockTimeoutMs?: number;
}

/** Postgres's error code when a lock was not granted within lock_timeout. */
const LOCK_NOT_AVAILABLE = '55P03';

/**
 * Applies every migration not yet applied, in one transaction. Safe to run
 * twice and from several processes at once: the transaction's first
 * statement takes an advisory lock that ends with it, so the second migrate
 * waits for the first, then finds nothing left to do. The lock is
 * transaction-scoped so that it cannot outlive its migrate through a
 * transaction pooler, which may put a session lock and its unlock on two
 * server connections. A lock not granted within `lockTimeoutMs` fails the
 * migrate naming the session that holds it.
 *
 * Takes a connection string or a pg Client/Pool (Node only; run it from a
 * deploy step or the CLI, not from a Worker).
 */
export async function migrate(target: string | pg.Pool | pg.Client, options: MigrateOptions = {}): Promise<void> {
  const lockTimeoutMs = options.lockTimeoutMs ?? 60_000;
  checkWhole('migrate option lockTimeoutMs', lockTimeoutMs, { min: 1 });
  const client =
    typeof target === 'string'
      ? new pg.Client({ connectionString: target })
      : target instanceof pg.Pool
        ? await target.connect()
        : target;
  if (typeof target === 'string') await (client as pg.Client).connect();
  // A connection that ends mid-migration fails the query in flight; without a
  // listener the client's 'error' event would also crash the process.
  let lost: Error | undefined;
  const onError = (err: Error) => (lost ??= err);
  client.on('error', onError);
  try {
    await client.query('BEGIN');
    try {
      await client.query(`SET LOCAL lock_timeout = ${Math.floor(lockTimeoutMs)}`);
      try {
        await client.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
      } catch (err) {
        if ((err as { code?: string }).code !== LOCK_NOT_AVAILABLE) throw err;
        throw new Error(await lockHeldMessage(target, lockTimeoutMs), { cause: err });
      }
      await client.query('SET LOCAL lock_timeout = 0');
      await applyMigrations(client, readMigrations(MIGRATIONS_FOLDER));
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
  } finally {
    client.off('error', onError);
    if (typeof target === 'string') await (client as pg.Client).end().catch(() => undefined);
    else if (target instanceof pg.Pool) (client as pg.PoolClient).release(lost);
  }
}

/** What to say when the migration lock is held elsewhere, naming who holds it where the server can tell. */
async function lockHeldMessage(target: string | pg.Pool | pg.Client, lockTimeoutMs: number): Promise<string> {
  let holders = '';
  const probe = typeof target === 'string' ? new pg.Client({ connectionString: target }) : null;
  try {
    const q = probe ?? (target as pg.Pool | pg.Client);
    if (probe) await probe.connect();
    const { rows } = await q.query<{ pid: number; application_name: string }>(
      `SELECT l.pid, a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE l.locktype = 'advisory' AND l.granted AND l.objid = $1`,
      [MIGRATION_LOCK],
    );
    holders = rows.map((r) => `pid ${r.pid}${r.application_name ? ` (${r.application_name})` : ''}`).join(', ');
  } catch {
    // The message stands without the holder's name.
  } finally {
    await probe?.end().catch(() => undefined);
  }
  return (
    `outlive: migrate could not take the migration lock within ${lockTimeoutMs} ms: ` +
    `another migrate is running, or a session holds the lock${holders ? ` (${holders})` : ''}. ` +
    'Wait for that migrate, or end the session holding it (SELECT pg_terminate_backend(pid)); a session lock left by an earlier ' +
    'release of outlive through a transaction pooler stays held until its server connection closes. Run migrate on a direct connection string.'
  );
}

/** One migration file, as its journal entry and its text give it. */
interface Migration {
  tag: string;
  /** The journal's `when`: what `outlive.migrations.created_at` records. */
  when: number;
  hash: string;
  statements: string[];
}

/** Reads the journal and the SQL files of `folder`, in journal order. */
export function readMigrations(folder: string): Migration[] {
  const journal = JSON.parse(readFileSync(path.join(folder, 'meta/_journal.json'), 'utf8')) as { entries: { tag: string; when: number }[] };
  return journal.entries.map(({ tag, when }) => {
    const text = readFileSync(path.join(folder, `${tag}.sql`), 'utf8');
    return { tag, when, hash: createHash('sha256').update(text).digest('hex'), statements: text.split('--> statement-breakpoint') };
  });
}

/**
 * Applies every migration newer than the last one recorded, in the
 * transaction `client` is in (the one holding the migration lock, so the
 * record read here is the one the last migrate committed).
 */
async function applyMigrations(client: pg.Client | pg.PoolClient, migrations: readonly Migration[]): Promise<void> {
  await client.query('CREATE SCHEMA IF NOT EXISTS "outlive"');
  await client.query('CREATE TABLE IF NOT EXISTS "outlive"."migrations" (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)');
  const { rows } = await client.query<{ created_at: string | null }>('SELECT created_at::text FROM "outlive"."migrations" ORDER BY created_at DESC LIMIT 1');
  const last = rows[0]?.created_at == null ? null : Number(rows[0].created_at);
  for (const m of migrations.filter((m) => last === null || last < m.when)) {
    for (const statement of m.statements) await client.query(statement);
    await client.query('INSERT INTO "outlive"."migrations" (hash, created_at) VALUES ($1, $2)', [m.hash, m.when]);
  }
}

