/**
 * Database pieces the serverless-function tests need beyond a fresh database:
 * a login role with a password distinctive enough to search logs for, and
 * polling.
 */
import pg from 'pg';
import { afterAll } from 'vitest';
import type { TestDb } from './db.js';

let roles = 0;

/**
 * Creates a login role with a random password for this test file and returns
 * the test database's URL signed in as it, so tests can assert the password
 * never reaches a log or a response. The role is dropped after the file.
 */
export async function roleUrl(db: TestDb): Promise<{ url: string; password: string }> {
  const name = `outlive_fn_${process.pid}_${roles++}`;
  const password = `pw-${crypto.randomUUID().replace(/-/g, '')}`;
  await db.pool.query(`CREATE ROLE ${name} LOGIN SUPERUSER PASSWORD '${password}'`);
  const u = new URL(db.url);
  u.username = name;
  u.password = password;
  const admin = new URL(db.url);
  admin.pathname = '/postgres';
  afterAll(async () => {
    const client = new pg.Client({ connectionString: admin.toString() });
    await client.connect();
    try {
      await client.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, [name]);
      await client.query(`DROP ROLE IF EXISTS ${name}`);
    } finally {
      await client.end();
    }
  });
  return { url: u.toString(), password };
}

/**
 * Polls `check` until it returns a value other than undefined/false, and
 * returns it. Fails after `timeoutMs` (a bound on a hang, not a timing claim).
 */
export async function waitFor<T>(check: () => Promise<T | undefined | false>, timeoutMs = 20_000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
