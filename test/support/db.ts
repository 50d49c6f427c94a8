/**
 * Per-file databases: each test file gets a fresh database cloned from the
 * migrated template, and a pool on it.
 */
import pg from 'pg';
import { afterAll, expect, inject, onTestFinished } from 'vitest';

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
  const pool = new pg.Pool({ connectionString: url, max: 20 });
  // pool.end() resolves before its clients' sockets have closed, so the
  // DROP ... WITH (FORCE) below can reach one still closing; its FATAL
  // arrives as a pool 'error' event, which with no listener is thrown.
  pool.on('error', () => undefined);
  let direct: pg.Pool | undefined;
  const dropDb = async () => {
    await pool.end();
    if (direct && direct !== pool) await direct.end();
    await dropDatabase(name);
  };
  // Made inside a test, it is dropped when that test ends (an afterAll
  // registered while a test runs is never called: four databases were left
  // behind by every run of worker.test.ts).
  if (expect.getState().currentTestName !== undefined) onTestFinished(dropDb);
  else afterAll(dropDb);
  return {
    pool,
    url,
    directUrl,
    pooled: url !== directUrl,
    get direct() {
      if (!direct) {
        direct = url === directUrl ? pool : new pg.Pool({ connectionString: directUrl, max: 10 });
        direct.on('error', () => undefined);
      }
      return direct;
    },
    rows: async (text, params) => (await pool.query(text, params)).rows,
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
 * early; it is dropped when the test ends in any case.
 */
export async function emptyDatabase(): Promise<{ url: string; directUrl: string; drop(): Promise<void> }> {
  const name = `outlive_t_${process.pid}_empty_${Date.now().toString(36)}_${counter++}`;
  const admin = new pg.Client({ connectionString: inject('pgUrl') });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const drop = () => dropDatabase(name);
  onTestFinished(drop);
  return { url: urlOn(inject('poolerUrl') || inject('pgUrl'), name), directUrl: urlOn(inject('pgUrl'), name), drop };
}
