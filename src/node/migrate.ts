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

/** Where the migrations ship, beside the compiled or source tree. */
export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../db/migrations', import.meta.url)).replace(
  /[\\/]dist[\\/]db[\\/]migrations$/,
  '/db/migrations',
);

// Any fixed number works, as long as no other code takes this advisory lock.
const MIGRATION_LOCK = 0x6f75746c; // "outl"

/**
 * Applies every migration not yet applied, in one transaction. Safe to run
 * twice and from several processes at once: a session advisory lock makes
 * the second wait for the first, then find nothing left to do.
 *
 * Takes a connection string or a pg Client/Pool (Node only; run it from a
 * deploy step or the CLI, not from a Worker).
 */
export async function migrate(target: string | pg.Pool | pg.Client): Promise<void> {
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
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
    try {
      await applyMigrations(client, readMigrations(MIGRATIONS_FOLDER));
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
    }
  } finally {
    client.off('error', onError);
    if (typeof target === 'string') await (client as pg.Client).end().catch(() => undefined);
    else if (target instanceof pg.Pool) (client as pg.PoolClient).release(lost);
  }
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

/** Applies, in one transaction, every migration newer than the last one recorded. */
async function applyMigrations(client: pg.Client | pg.PoolClient, migrations: readonly Migration[]): Promise<void> {
  await client.query('CREATE SCHEMA IF NOT EXISTS "outlive"');
  await client.query('CREATE TABLE IF NOT EXISTS "outlive"."migrations" (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)');
  const { rows } = await client.query<{ created_at: string | null }>('SELECT created_at::text FROM "outlive"."migrations" ORDER BY created_at DESC LIMIT 1');
  const last = rows[0]?.created_at == null ? null : Number(rows[0].created_at);
  const pending = migrations.filter((m) => last === null || last < m.when);
  if (pending.length === 0) return;
  await client.query('BEGIN');
  try {
    for (const m of pending) {
      for (const statement of m.statements) await client.query(statement);
      await client.query('INSERT INTO "outlive"."migrations" (hash, created_at) VALUES ($1, $2)', [m.hash, m.when]);
    }
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

