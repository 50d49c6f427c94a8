/**
 * How a pass's hot statements travel: named, so each connection parses and
 * plans them once, or unnamed, parsed on every call. Named statements live in
 * one server connection's session; a transaction pooler (PgBouncer in
 * `pool_mode = transaction`, as behind most managed Postgres's pooled URL)
 * hands each transaction whichever server connection is free, so unless it
 * tracks prepared statements itself (PgBouncer 1.21+ with
 * `max_prepared_statements` above 0) a statement prepared on one is missing
 * on the next, or already there under the same name. Postgres says which, so
 * a pool in `'auto'` mode sends named statements until it is told, then sends
 * them unnamed for good.
 *
 * The claim keeps its plan either way: its plan is made inside the
 * `outlive.claim` function, generic and by index whatever the statement that
 * calls it looks like (src/pass/claim.ts).
 */
import type { PoolClientLike, PoolLike, Queryable } from './executor.js';

/**
 * Whether a pass sends its hot statements as named prepared statements:
 * `'auto'` (the default) until the database's path shows it cannot keep them
 * (a transaction pooler without prepared-statement support), then unnamed;
 * `true` always named (a direct connection, or a pooler that keeps them);
 * `false` never.
 */
export type PreparedStatements = boolean | 'auto';

/** invalid_sql_statement_name: `prepared statement "x" does not exist`. */
const NOT_PREPARED = '26000';
/** duplicate_prepared_statement: `prepared statement "x" already exists`. */
const ALREADY_PREPARED = '42P05';

/**
 * True for the errors of a named statement that its server connection did
 * not have, or already had: what a transaction pooler without
 * prepared-statement support answers. Nothing was executed (they fail at
 * Parse or Bind), so the statement may be sent again.
 */
export function lostPreparedStatement(err: unknown): boolean {
  const code = (err as { code?: unknown })?.code;
  return code === NOT_PREPARED || code === ALREADY_PREPARED;
}

/** What a pool in `'auto'` mode has learned about its database's path. */
interface Path {
  unnamed: boolean;
}

// Keyed by where a pool connects, not only by the pool: on Workers and Vercel
// every invocation makes its own pool, and an isolate that learned once need
// not be told again on every invocation.
const pathsByTarget = new Map<string, Path>();
const pathsByPool = new WeakMap<object, Path>();

function targetOf(pool: PoolLike): string | null {
  const o = (pool as { options?: { connectionString?: unknown; host?: unknown; port?: unknown; database?: unknown; user?: unknown } }).options;
  if (!o) return null;
  if (typeof o.connectionString === 'string') return o.connectionString;
  if (typeof o.host === 'string') return `${String(o.user)}@${o.host}:${String(o.port)}/${String(o.database)}`;
  return null;
}

function pathOf(pool: PoolLike): Path {
  let path = pathsByPool.get(pool);
  if (path) return path;
  const target = targetOf(pool);
  path = (target && pathsByTarget.get(target)) || { unnamed: false };
  if (target) pathsByTarget.set(target, path);
  pathsByPool.set(pool, path);
  return path;
}

/** Marks a wrapper, and says whether a transaction on it that lost a prepared statement may run again unnamed. */
const RELEARNS = Symbol('outlive.relearns');

interface StatementsPool extends PoolLike {
  [RELEARNS]: () => boolean;
}

const wrappers = new WeakMap<PoolLike, Map<PreparedStatements, StatementsPool>>();

type QueryConfig = { name?: string; text: string; values?: unknown[] };
type Query = Queryable['query'];
type Send = (this: object, textOrConfig: string | QueryConfig, values?: unknown[]) => Promise<{ rows: unknown[] }>;

function explain(err: unknown): unknown {
  const e = err as Error & { code?: string };
  return Object.assign(
    new Error(
      `${e.message}: the database's connection path does not keep prepared statements (a transaction pooler such as PgBouncer before 1.21, or with max_prepared_statements = 0); leave preparedStatements at 'auto' or set it to false`,
      { cause: err },
    ),
    { code: e.code },
  );
}

/**
 * `pool`, sending named statements as `mode` says. The same pool and mode
 * give the same wrapper, so what is keyed by pool (announced names) holds.
 */
export function withPreparedStatements(pool: PoolLike, mode: PreparedStatements = 'auto'): PoolLike {
  if (mode !== true && mode !== false && mode !== 'auto') {
    throw new TypeError(`outlive: preparedStatements must be true, false or 'auto', got ${JSON.stringify(mode)}`);
  }
  const byMode = wrappers.get(pool) ?? wrappers.set(pool, new Map()).get(pool)!;
  const known = byMode.get(mode);
  if (known) return known;
  const path = pathOf(pool);
  const named = () => mode === true || (mode === 'auto' && !path.unnamed);

  // A statement sent on its own may be sent again unnamed; one inside a
  // transaction has aborted it, so the transaction is run again instead.
  const send = (original: Query, target: object, alone: boolean): Query => {
    const query = original as Send;
    return (async (textOrConfig: string | QueryConfig, values?: unknown[]) => {
      if (typeof textOrConfig === 'string' || !textOrConfig.name) return query.call(target, textOrConfig, values);
      const { name, text, values: params } = textOrConfig;
      if (!named()) return query.call(target, text, params);
      try {
        return await query.call(target, { name, text, values: params });
      } catch (err) {
        if (!lostPreparedStatement(err)) throw err;
        if (mode === true) throw explain(err);
        path.unnamed = true;
        if (!alone) throw err;
        return query.call(target, text, params);
      }
    }) as Query;
  };

  const wrapper: StatementsPool = {
    query: send(pool.query, pool, true),
    async connect() {
      const client = await pool.connect();
      const query = send(client.query, client, false);
      return new Proxy(client, {
        get(target, key) {
          if (key === 'query') return query;
          const value: unknown = Reflect.get(target, key, target);
          return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
        },
      }) as PoolClientLike;
    },
    [RELEARNS]: () => mode === 'auto' && path.unnamed,
  };
  byMode.set(mode, wrapper);
  return wrapper;
}

/**
 * True when a transaction on `pool` that failed with `err` should run again:
 * the pool just learned that its path keeps no prepared statements, and its
 * next run sends them unnamed.
 */
export function runAgainUnnamed(pool: PoolLike, err: unknown): boolean {
  return lostPreparedStatement(err) && ((pool as Partial<StatementsPool>)[RELEARNS]?.() ?? false);
}
