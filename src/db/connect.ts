/**
 * Which driver an invocation's pool speaks, and the pool itself: the one
 * place that decides, for every platform.
 *
 * - **node-postgres** (`pg`) reaches any Postgres over TCP: on Node (Vercel's
 *   Node.js runtime, a plain server), and on Workers with `nodejs_compat`,
 *   through a Hyperdrive binding or straight to the database.
 * - **Neon's serverless driver** speaks Postgres over a WebSocket to Neon's
 *   proxy: on Workers without `nodejs_compat`, on edge runtimes, and wherever
 *   the app asks for it or its URL is Neon's.
 *
 * A pass behaves the same on either: both pools have node-postgres' API,
 * which `executor.ts` adapts. The platform entry points only say what their
 * runtime has (`Runtime`); they never pick a driver themselves.
 */
import { ConfigError } from '../model/errors.js';
import type { PoolLike } from './executor.js';
import { neonPool } from './neon.js';

/** The drivers an invocation's pool may use. */
export type DriverName = 'pg' | 'neon';

/** The pool an invocation opens: a node-postgres or Neon `Pool`, which share this API. */
export interface InvocationPool extends PoolLike {
  /** Runs one statement; handlers use it for their own short queries. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  query<R = any>(text: string, params?: unknown[]): Promise<{ rows: R[]; rowCount: number | null }>;
  query(config: { name?: string; text: string; values?: unknown[] }): Promise<{ rows: unknown[] }>;
  end(): Promise<void>;
  /** An idle client's error; both drivers' pools pass the client too. */
  on(event: 'error', listener: (err: unknown, client?: object) => void): unknown;
  /** A client given back, with the error it was given back with (the pool then ends it). */
  on(event: 'release', listener: (err: unknown, client: object) => void): unknown;
}

/** The part of the `pg` module (node-postgres) outlive uses: its `Pool` class. Pass the module itself. */
export interface PgModule {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  Pool: new (config: { connectionString: string; max: number; connectionTimeoutMillis: number }) => any;
}

/** A Cloudflare Hyperdrive binding, as a Worker's `env` holds it. */
export interface HyperdriveBinding {
  /** The connection string that reaches the database through Hyperdrive (locally: `localConnectionString`). */
  readonly connectionString: string;
}

/** What the runtime an invocation runs in can do. */
export interface Runtime {
  /** `workerd` (Cloudflare Workers), `node`, or `edge` (Vercel's Edge runtime and others without TCP). */
  kind: 'workerd' | 'node' | 'edge';
  /** node-postgres, where the app or the runtime provides it. */
  pg?: PgModule | undefined;
  /** The driver the app asked for; otherwise chosen as {@link chooseDatabase} says. */
  driver?: DriverName | undefined;
}

/** The settings {@link chooseDatabase} reads. */
export interface DatabaseEnv {
  DATABASE_URL?: unknown;
  /** A Hyperdrive binding (Workers). */
  HYPERDRIVE?: unknown;
  /** A WebSocket proxy in front of a Postgres that is not Neon, for the Neon driver (local development and tests). */
  NEON_WS_PROXY?: unknown;
}

/** Which database an invocation reaches, through which driver. */
export interface DatabaseChoice {
  driver: DriverName;
  connectionString: string;
  /** Where the connection string came from. */
  from: 'HYPERDRIVE' | 'DATABASE_URL';
}

/** Most connections an invocation's pool opens: a Worker invocation may hold 6 at a time, and a pass needs 2. */
export const INVOCATION_POOL_MAX = 5;

/** How long an invocation waits for a connection before failing (ms). */
export const CONNECT_TIMEOUT_MS = 10_000;

/** True for a connection string whose host is Neon's (`*.neon.tech`). */
export function isNeonUrl(connectionString: string): boolean {
  try {
    return /(^|\.)neon\.tech$/i.test(new URL(connectionString).hostname);
  } catch {
    return false;
  }
}

function hyperdriveOf(env: DatabaseEnv): HyperdriveBinding | undefined {
  const binding = env.HYPERDRIVE as Partial<HyperdriveBinding> | undefined;
  if (binding === undefined || binding === null) return undefined;
  if (typeof binding !== 'object' || typeof binding.connectionString !== 'string' || binding.connectionString === '') {
    throw new ConfigError('outlive: HYPERDRIVE is set but is not a Hyperdrive binding: declare it under [[hyperdrive]] in wrangler.toml');
  }
  return binding as HyperdriveBinding;
}

function databaseUrlOf(env: DatabaseEnv, driver: DriverName, runtime: Runtime['kind']): DatabaseChoice {
  const url = env.DATABASE_URL;
  if (typeof url !== 'string' || url === '') {
    const where =
      runtime === 'workerd'
        ? 'add a Hyperdrive binding named HYPERDRIVE (with node-postgres), or set the secret DATABASE_URL (`npx wrangler secret put DATABASE_URL`; locally in .dev.vars)'
        : 'set DATABASE_URL to your Postgres connection string in the environment (Vercel: the project\'s environment variables; locally: .env.local)';
    throw new ConfigError(`outlive: DATABASE_URL is not set: ${where}`);
  }
  return { driver, connectionString: url, from: 'DATABASE_URL' };
}

/**
 * Decides the driver and connection string of an invocation, the same way on
 * every platform:
 * 1. the driver the app asked for, where the runtime can honour it;
 * 2. on an edge runtime (no TCP), Neon's driver;
 * 3. with a Hyperdrive binding `HYPERDRIVE` (Workers), node-postgres through it;
 * 4. on `DATABASE_URL`: Neon's driver where node-postgres is not available
 *    (a Worker without `nodejs_compat`), where the URL is Neon's, or where
 *    `NEON_WS_PROXY` names a proxy for it; node-postgres otherwise.
 * Throws {@link ConfigError} naming the fix; never a setting's value.
 */
export function chooseDatabase(env: DatabaseEnv, runtime: Runtime): DatabaseChoice {
  const asked = runtime.driver;
  if (asked !== undefined && asked !== 'pg' && asked !== 'neon') {
    throw new ConfigError(`outlive: driver must be 'pg' or 'neon', got ${JSON.stringify(asked)}`);
  }
  if (runtime.kind === 'edge') {
    if (asked === 'pg') throw new ConfigError("outlive: driver 'pg' needs TCP sockets, which an edge runtime does not have: use the Node.js runtime, or driver 'neon'");
    return databaseUrlOf(env, 'neon', runtime.kind);
  }
  if (asked === 'neon') return databaseUrlOf(env, 'neon', runtime.kind);
  const hyperdrive = runtime.kind === 'workerd' ? hyperdriveOf(env) : undefined;
  if (!runtime.pg) {
    if (asked === 'pg' || hyperdrive) {
      throw new ConfigError(
        runtime.kind === 'workerd'
          ? "outlive: node-postgres is not available to this Worker: `import pg from 'pg'` and pass it, createCloudflareWorker(tasks, { pg }), " +
              'with compatibility_flags = ["nodejs_compat"] in wrangler.toml'
          : 'outlive: node-postgres is not available: add `pg` to the app\'s dependencies',
      );
    }
    return databaseUrlOf(env, 'neon', runtime.kind);
  }
  if (hyperdrive) return { driver: 'pg', connectionString: hyperdrive.connectionString, from: 'HYPERDRIVE' };
  const choice = databaseUrlOf(env, 'pg', runtime.kind);
  const neon = asked === undefined && (isNeonUrl(choice.connectionString) || (typeof env.NEON_WS_PROXY === 'string' && env.NEON_WS_PROXY !== ''));
  return neon ? { ...choice, driver: 'neon' } : choice;
}

/** How {@link openInvocationPool} makes the pool beyond the choice itself. */
export interface OpenPoolOptions {
  /** node-postgres, for a `pg` choice. */
  pg?: PgModule | undefined;
  /** The Neon driver's WebSocket proxy (`NEON_WS_PROXY`), for a `neon` choice. */
  wsProxy?: string | undefined;
  /** The WebSocket class, for a `neon` choice on a runtime without one (Node before 22). */
  webSocketConstructor?: unknown;
}

/**
 * Opens the pool of one invocation for a {@link DatabaseChoice}. Nothing
 * connects until the first query; close it with `end()` when the invocation
 * is done.
 */
export function openInvocationPool(choice: DatabaseChoice, options: OpenPoolOptions = {}): InvocationPool {
  if (choice.driver === 'neon') {
    return neonPool({
      connectionString: choice.connectionString,
      wsProxy: options.wsProxy,
      webSocketConstructor: options.webSocketConstructor,
      max: INVOCATION_POOL_MAX,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    }) as unknown as InvocationPool;
  }
  if (!options.pg || typeof options.pg.Pool !== 'function') {
    throw new ConfigError("outlive: the pg driver was chosen but node-postgres was not given: pass the `pg` module");
  }
  return new options.pg.Pool({
    connectionString: choice.connectionString,
    max: INVOCATION_POOL_MAX,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
  }) as InvocationPool;
}
