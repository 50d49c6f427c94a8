/**
 * The one seam between the engine and database drivers.
 *
 * The engine speaks to an {@link Executor}: something that runs a SQL text
 * with positional parameters and returns rows. Every driver outlive accepts is
 * adapted here and nowhere else: node-postgres clients and pools, Neon's
 * serverless Pool and Client (which share node-postgres' API), and drizzle
 * databases and transactions of any Postgres driver.
 */

import { runAgainUnnamed } from './statements.js';

/**
 * A statement as drizzle's `execute` takes it: drizzle calls `getSQL()`, then
 * `toQuery()` with its dialect, so this is all a drizzle SQL object needs to
 * be for it. Built here without importing drizzle-orm, which an app may not
 * have (it is an optional peer), or have in another version.
 */
export interface StatementSql {
  getSQL(): StatementSql;
  toQuery(config: { escapeParam(index: number, value: unknown): string }): { sql: string; params: unknown[] };
}

/** Runs one statement and returns its rows. */
export interface Executor {
  /**
   * `name`, where given, makes the statement a named prepared statement on
   * drivers that support it (node-postgres, Neon's Pool): parsed and planned
   * once per connection instead of on every call. Hot statements only.
   */
  query<R = Record<string, unknown>>(text: string, params?: readonly unknown[], name?: string): Promise<R[]>;
}

/** A node-postgres-style client, pool or pool client (pg, @neondatabase/serverless). */
export interface Queryable {
  query(text: string, params?: unknown[]): Promise<{ rows: unknown[] }>;
  query(config: { name?: string; text: string; values?: unknown[] }): Promise<{ rows: unknown[] }>;
}

/** A drizzle database or transaction (node-postgres, neon-serverless, neon-http, ...). */
export interface DrizzleExecutor {
  // drizzle types its parameter as its own SQLWrapper; any keeps this seam free of drizzle's types.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  execute(query: any): PromiseLike<unknown>;
}

/** What `enqueue` accepts as its transaction: a pg client inside BEGIN, or a drizzle transaction. */
export type Transactional = Queryable | DrizzleExecutor;

/** A pool a pass checks clients out of (pg.Pool, Neon's Pool). */
export interface PoolLike extends Queryable {
  connect(): Promise<PoolClientLike>;
}

/** A client checked out of a {@link PoolLike}. */
export interface PoolClientLike extends Queryable {
  release(err?: Error | boolean): void;
}

/** What a pass accepts as its database: a pool, or a drizzle database built on one. */
export type Database = PoolLike | { $client: PoolLike };

function isQueryable(db: unknown): db is Queryable {
  return typeof (db as Queryable)?.query === 'function';
}

function isDrizzle(db: unknown): db is DrizzleExecutor {
  return typeof (db as DrizzleExecutor)?.execute === 'function';
}

/**
 * A `$1`-style text and its parameters as a statement drizzle's `execute`
 * runs, so the same statement text serves pg clients and drizzle
 * transactions alike. Each `$n` becomes the dialect's placeholder for
 * parameter n (Postgres's is `$n` again), so a parameter used twice travels once.
 */
export function toStatementSql(text: string, params: readonly unknown[]): StatementSql {
  const statement: StatementSql = {
    getSQL: () => statement,
    toQuery: ({ escapeParam }) => ({
      sql: text.replace(/\$(\d+)/g, (_, n: string) => escapeParam(Number(n) - 1, params[Number(n) - 1])),
      params: [...params],
    }),
  };
  return statement;
}

function rowsOf(result: unknown): Record<string, unknown>[] {
  if (Array.isArray(result)) return result as Record<string, unknown>[];
  const rows = (result as { rows?: unknown })?.rows;
  if (Array.isArray(rows)) return rows as Record<string, unknown>[];
  return [];
}

/** Adapts any accepted driver object to an {@link Executor}. */
export function toExecutor(db: Transactional): Executor {
  if (isQueryable(db)) {
    return {
      async query<R>(text: string, params: readonly unknown[] = [], name?: string) {
        const result = name ? await db.query({ name, text, values: params as unknown[] }) : await db.query(text, params as unknown[]);
        return result.rows as R[];
      },
    };
  }
  if (isDrizzle(db)) {
    return {
      async query<R>(text: string, params: readonly unknown[] = []) {
        return rowsOf(await db.execute(toStatementSql(text, params))) as R[];
      },
    };
  }
  throw new TypeError(
    'outlive: expected a pg client, a Neon client or a drizzle transaction; got ' +
      (db === null ? 'null' : typeof db),
  );
}

/** Finds the pool behind a pool or a drizzle database. */
export function toPool(db: Database): PoolLike {
  const pool = '$client' in db && db.$client ? db.$client : (db as PoolLike);
  if (typeof pool.connect !== 'function' || typeof pool.query !== 'function') {
    throw new TypeError(
      'outlive: a pass needs a connection pool (pg.Pool, Neon Pool, or a drizzle database built on one)',
    );
  }
  return pool;
}

/**
 * Runs `fn` with a client of `pool` inside BEGIN, then COMMIT if it resolves,
 * ROLLBACK if it throws. A client whose ROLLBACK failed (a broken
 * connection) is destroyed rather than returned to the pool.
 */
export async function transaction<T>(pool: PoolLike, fn: (client: PoolClientLike) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  // node-postgres' pool drops its own 'error' listener from a client while it
  // is checked out, and a client emits 'error' when its connection ends, even
  // mid-query: with no listener that event would crash the process. The
  // query in flight fails on its own; this only keeps the event handled.
  const emitter = client as unknown as { on?(e: 'error', f: (err: Error) => void): void; off?(e: 'error', f: (err: Error) => void): void };
  let broken: Error | undefined;
  const onError = (err: Error) => (broken ??= err);
  emitter.on?.('error', onError);
  try {
    await client.query('BEGIN');
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch((e: Error) => (broken ??= e));
    throw err;
  } finally {
    emitter.off?.('error', onError);
    client.release(broken);
  }
}

/**
 * As {@link transaction}, handing `fn` an {@link Executor}. A transaction
 * that failed because its pool just learned that prepared statements do not
 * survive its path (`src/db/statements.ts`) runs once more, unnamed.
 */
export async function inTransaction<T>(pool: PoolLike, fn: (db: Executor) => Promise<T>): Promise<T> {
  try {
    return await transaction(pool, (client) => fn(toExecutor(client)));
  } catch (err) {
    if (!runAgainUnnamed(pool, err)) throw err;
    return transaction(pool, (client) => fn(toExecutor(client)));
  }
}

/** Postgres's error code when it broke a deadlock by failing this transaction. */
const DEADLOCK = '40P01';

/**
 * As {@link inTransaction}, run again (up to `attempts` times in all) when
 * Postgres chose this transaction as a deadlock's victim. For operator
 * actions (cancel, retry) that lock a run's tasks all at once, and so may
 * meet a settle that locks some of them in another order: the loser of such
 * a meeting should try again, not fail the operator's call.
 */
export async function inTransactionRetryingDeadlocks<T>(pool: PoolLike, fn: (db: Executor) => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await inTransaction(pool, fn);
    } catch (err) {
      if ((err as { code?: unknown })?.code !== DEADLOCK || attempt >= attempts) throw err;
    }
  }
}

