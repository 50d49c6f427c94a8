/**
 * Migrate: bring the `outlive` schema up to date, from the SQL files that
 * drizzle-kit generated into `db/migrations`.
 */
import { fileURLToPath } from 'node:url';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate as drizzleMigrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';

/** Where the migrations ship, beside the compiled or source tree. */
export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../db/migrations', import.meta.url)).replace(
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
      await drizzleMigrate(drizzle(client as pg.Client), {
        migrationsFolder: MIGRATIONS_FOLDER,
        migrationsSchema: 'outlive',
        migrationsTable: 'migrations',
      });
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
    }
  } finally {
    client.off('error', onError);
    if (typeof target === 'string') await (client as pg.Client).end().catch(() => undefined);
    else if (target instanceof pg.Pool) (client as pg.PoolClient).release(lost);
  }
}
