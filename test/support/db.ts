/**
 * Per-file databases: each test file gets a fresh database cloned from the
 * migrated template, and a pool on it.
 */
import pg from 'pg';
import { afterAll, expect, inject, onTestFinished } from 'vitest';
import { toExecutor, type Executor, type PoolLike } from '../../src/db/executor.js';
import { withPreparedStatements } from '../../src/db/statements.js';

/** What a test needs: a pool on its own fresh database, and its URL. */
export interface TestDb {
  /** A pool on `url`: through the suite's pooler when it has one. */
  pool: pg.Pool;
  /** The database's URL as an app would be given it: the pooled one when the suite runs through a pooler. */
  url: string;
  /** The database's URL straight to the server, for what a pooler cannot carry (LISTEN, session locks). */
  directUrl: string;
  /** True when `url` goes through a transaction pooler. */
  pooled: boolean;
  /**
   * A pool straight to the server (made on first use), for tests of the
   * planner and of session state (PREPARE, SET, LISTEN), which no
   * transaction pooler carries; `pool` itself when the suite runs direct.
   */
  readonly direct: pg.Pool;
  /** Runs one query on the pool and returns its rows. */
  rows<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  /**
   * Another pool, on `url` unless the config names a URL: closed with
   * `closePool` before the database is dropped, if the test has not closed it.
   */
  newPool(config?: pg.PoolConfig): pg.Pool;
}

/** The connections of each pool made here that have not closed yet. */
const openClients = new WeakMap<pg.Pool, Set<pg.PoolClient>>();

/**
 * A pg pool whose connections `closePool` can wait for: the only way test
 * files make pools (test-databases.test.ts holds them to it).
 */
export function openPool(config: pg.PoolConfig): pg.Pool {
  const pool = new pg.Pool(config);
  const open = new Set<pg.PoolClient>();
  openClients.set(pool, open);
  pool.on('connect', (client) => {
    open.add(client);
    client.once('end', () => open.delete(client));
  });
  return pool;
}

/**
 * Ends a pool made by `openPool` and resolves once each of its connections has
 * closed: pool.end() resolves when it has asked them to, so a DROP DATABASE
 * right after it can still find their backends.
 */
export async function closePool(pool: pg.Pool): Promise<void> {
  const open = openClients.get(pool);
  if (!open) throw new Error('closePool: not a pool made by openPool');
  const closed = [...open].map((client) => new Promise((resolve) => client.once('end', resolve)));
  if (!pool.ending) await pool.end();
  await Promise.all(closed);
}

/**
 * What a pass claims and settles through: `pool` sending named statements as
 * tick does, until a transaction pooler shows it cannot keep them. A test
 * that sends the pass's named statements on a bare pool fails through
 * PgBouncer in transaction mode, where no deployment sends them that way.
 */
export function passPool(pool: PoolLike): PoolLike {
  return withPreparedStatements(pool);
}

/** {@link passPool} as the executor a claim takes. */
export function passExecutor(pool: PoolLike): Executor {
  return toExecutor(passPool(pool));
}

let counter = 0;

/** True when the suite reaches its databases through a transaction pooler (TEST_POOLER). */
export function throughPooler(): boolean {
  return inject('poolerUrl') !== '';
}

function urlOn(server: string, database: string): string {
  const u = new URL(server);
  u.pathname = `/${database}`;
  return u.toString();
}

/**
 * Creates a fresh migrated database: made at the top level of a file
 * (`const db = await freshDb()`), it is dropped after the file; made inside a
 * test, when that test ends.
 */
export async function freshDb(): Promise<TestDb> {
  const adminUrl = inject('pgUrl');
  const name = `outlive_t_${process.pid}_${Date.now().toString(36)}_${counter++}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name} TEMPLATE ${inject('templateDb')}`);
  await admin.end();
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  const directUrl = u.toString();
  const poolerUrl = inject('poolerUrl');
  const url = poolerUrl ? urlOn(poolerUrl, name) : directUrl;
  const { newPool, drop } = poolsOn(name, url);
  const pool = newPool({ max: 20 });
  // Tests terminate backends by pid (worker, connection-loss, chaos): an idle
  // client of this pool among them would report it as a pool 'error', which
  // with no listener is thrown.
  pool.on('error', () => undefined);
  let direct: pg.Pool | undefined;
  // Made inside a test, it is dropped when that test ends (an afterAll
  // registered while a test runs is never called: four databases were left
  // behind by every run of worker.test.ts).
  if (expect.getState().currentTestName !== undefined) onTestFinished(drop);
  else afterAll(drop);
  return {
    pool,
    url,
    directUrl,
    pooled: url !== directUrl,
    get direct() {
      if (!direct) {
        if (url === directUrl) direct = pool;
        else {
          direct = newPool({ connectionString: directUrl, max: 10 });
          direct.on('error', () => undefined);
        }
      }
      return direct;
    },
    rows: async (text, params) => (await pool.query(text, params)).rows,
    newPool,
  };
}

/** Pools on a test database (on `url` unless their config names one), and its drop, which closes them first. */
function poolsOn(name: string, url: string): { newPool(config?: pg.PoolConfig): pg.Pool; drop(): Promise<void> } {
  const pools: pg.Pool[] = [];
  return {
    newPool(config) {
      const pool = openPool({ connectionString: url, ...config });
      pools.push(pool);
      return pool;
    },
    async drop() {
      await Promise.all(pools.map(closePool));
      await dropDatabase(name);
    },
  };
}

async function dropDatabase(name: string): Promise<void> {
  const admin = new pg.Client({ connectionString: inject('pgUrl') });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.end();
}

/**
 * Creates an empty database (no outlive schema: for tests of migrate), made
 * direct as an admin statement; `url` reaches it on the suite's path (through
 * its pooler when it has one), `directUrl` straight. `drop` may be called
 * early; it is dropped when the test ends in any case, after the pools
 * `newPool` made on it are closed.
 */
export async function emptyDatabase(): Promise<{ url: string; directUrl: string; newPool(config?: pg.PoolConfig): pg.Pool; drop(): Promise<void> }> {
  const name = `outlive_t_${process.pid}_empty_${Date.now().toString(36)}_${counter++}`;
  const admin = new pg.Client({ connectionString: inject('pgUrl') });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = urlOn(inject('poolerUrl') || inject('pgUrl'), name);
  const { newPool, drop } = poolsOn(name, url);
  onTestFinished(drop);
  return { url, directUrl: urlOn(inject('pgUrl'), name), newPool, drop };
}
