/**
 * The Neon serverless driver, one pool per invocation.
 *
 * On Cloudflare Workers a WebSocket opened while handling one request cannot
 * be used while handling another, so a pool must not outlive its invocation:
 * open it when the event starts, hand it to the pass, and close it through
 * `ctx.waitUntil(pool.end())`. The same helper serves Vercel and Node, where
 * a pool per invocation costs one WebSocket handshake and is simple to reason
 * about.
 *
 * Settings are given per pool (each client of the pool is configured as it is
 * made), never through the driver's global `neonConfig`, so two pools with
 * different settings can live in one isolate.
 */
import { checkWhole } from '../model/checks.js';
import { Client, Pool, type ClientConfig } from '@neondatabase/serverless';
import { ConfigError, toError } from '../model/errors.js';

/** Options of {@link neonPool}. */
export interface NeonPoolOptions {
  /** The database's connection string (on Workers, a secret binding such as `DATABASE_URL`). */
  connectionString: string;
  /**
   * A WebSocket proxy of your own in front of a Postgres that is not Neon,
   * for local development and tests: `ws://127.0.0.1:8080/v1` (or without the
   * scheme, meaning `ws:`). The driver then connects to
   * `<proxy>?address=<db host>:<db port>`. Leave unset for Neon.
   */
  wsProxy?: string | undefined;
  /**
   * The WebSocket class, where the runtime has none (Node before 22: pass
   * `WebSocket` from the `ws` package). Workers, Deno, Bun and Node 22+ have one.
   */
  webSocketConstructor?: unknown;
  /**
   * Most connections the pool opens at once. Default 5: a Worker invocation
   * may hold 6 outbound connections at a time, and a pass needs at most two
   * (a claim and a settle in flight together); the rest are for handlers.
   */
  max?: number;
  /** How long to wait for a connection before failing. Default 10 s. */
  connectionTimeoutMillis?: number;
}

/** A proxy setting as the driver wants it: host, port and path, and whether it is `wss:`. */
function parseProxy(proxy: string): { address: string; secure: boolean } {
  const match = /^(wss?):\/\/(.+)$/.exec(proxy.trim());
  const address = (match ? match[2]! : proxy.trim()).replace(/\/+$/, '');
  if (!address || /[?#\s]/.test(address)) {
    throw new ConfigError(`outlive: the WebSocket proxy must look like ws://host:port/path, got ${JSON.stringify(proxy)}`);
  }
  return { address, secure: match?.[1] === 'wss' };
}

/** Where a pool connects, for an error: host and port (never the user or password), and the proxy. */
function describeTarget(connectionString: string, proxy: string | undefined): string {
  let where = 'the database';
  try {
    const u = new URL(connectionString);
    where = `${u.hostname}:${u.port || 5432}`;
  } catch {
    // Not a URL: the driver will say so itself.
  }
  return proxy ? `${where} through ${proxy}` : where;
}

/** An Error for a failed connect: kept when it says something, made to say what was being opened when not. */
function explainConnect(err: unknown, target: string): Error {
  if (err instanceof Error && err.message !== '') return err;
  const said = toError(err).message;
  const why = /^non-Error thrown: an? \w+$/.test(said) || said === '' ? 'the runtime gave no reason' : said;
  return new Error(`outlive: could not open a WebSocket to ${target}: ${why}`, { cause: err });
}

/**
 * Opens a Neon serverless `Pool` for one invocation. Nothing connects until
 * the first query. Close it with `pool.end()` when the invocation is done
 * (on Workers: `ctx.waitUntil(pool.end())`).
 *
 * ```ts
 * const pool = neonPool({ connectionString: env.DATABASE_URL });
 * try {
 *   await tick(pool, { tasks, budgetMs: 20_000 });
 * } finally {
 *   ctx.waitUntil(pool.end());
 * }
 * ```
 */
export function neonPool(options: NeonPoolOptions): Pool {
  if (typeof options.connectionString !== 'string' || options.connectionString.length === 0) {
    throw new ConfigError('outlive: neonPool needs a connection string: set DATABASE_URL to your Neon database URL');
  }
  const max = options.max ?? 5;
  checkWhole('neonPool max', max, { min: 1 });
  const proxy = options.wsProxy ? parseProxy(options.wsProxy) : null;
  const webSocketConstructor = options.webSocketConstructor;

  const pool = new Pool({
    connectionString: options.connectionString,
    max,
    connectionTimeoutMillis: options.connectionTimeoutMillis ?? 10_000,
  });
  const target = describeTarget(options.connectionString, proxy?.address);
  // The pool makes its clients with `new this.Client(options)`; this class
  // configures each one as it is made.
  class ConfiguredClient extends Client {
    constructor(config?: string | ClientConfig) {
      super(config);
      const c = this.neonConfig;
      if (webSocketConstructor) c.webSocketConstructor = webSocketConstructor as typeof c.webSocketConstructor;
      if (proxy) {
        c.wsProxy = (host, port) => `${proxy.address}?address=${host}:${port}`;
        c.useSecureWebSocket = proxy.secure;
        // Pipelining the password with the startup message works only with
        // Neon's cleartext-password handshake; a plain Postgres may ask for
        // SCRAM or nothing at all.
        c.pipelineConnect = false;
        c.pipelineTLS = false;
      }
    }

    // A WebSocket that cannot open fails with an Event, not an Error, and on
    // Node 24 one with no message at all: say what was being opened.
    override connect(callback?: (err?: Error) => void): Promise<void> {
      if (callback) return super.connect((err?: Error) => callback(err ? explainConnect(err, target) : err)) as unknown as Promise<void>;
      return super.connect().catch((err: unknown) => {
        throw explainConnect(err, target);
      });
    }
  }
  pool.Client = ConfiguredClient;
  return pool;
}
