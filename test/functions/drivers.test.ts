/**
 * Which driver an invocation uses (`src/db/connect.ts`, the one place that
 * decides), and the errors that name the fix when a deployment cannot work.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { chooseDatabase, isNeonUrl, type PgModule } from '../../src/db/connect.js';
import { neonPool } from '../../src/db/neon.js';
import { ConfigError } from '../../src/model/errors.js';

const local = 'postgres://app:secret-pw@127.0.0.1:5432/app';
const neon = 'postgres://app:secret-pw@ep-cool-name-123456-pooler.eu-central-1.aws.neon.tech/neondb?sslmode=require';
const hyperdrive = { connectionString: 'postgres://gen:gen-pw@abc.hyperdrive.local:5432/app' };
const withPg = (kind: 'workerd' | 'node' | 'edge', driver?: 'pg' | 'neon') => ({ kind, pg: pg as unknown as PgModule, driver });
const without = (kind: 'workerd' | 'node' | 'edge', driver?: 'pg' | 'neon') => ({ kind, driver });

describe('the driver of an invocation', () => {
  it('on Node: node-postgres for any Postgres, Neon\'s driver for a Neon URL or a Neon proxy, or as asked', () => {
    expect(chooseDatabase({ DATABASE_URL: local }, withPg('node'))).toEqual({ driver: 'pg', connectionString: local, from: 'DATABASE_URL' });
    expect(chooseDatabase({ DATABASE_URL: neon }, withPg('node')).driver).toBe('neon');
    expect(chooseDatabase({ DATABASE_URL: local, NEON_WS_PROXY: '127.0.0.1:1/v1' }, withPg('node')).driver).toBe('neon');
    expect(chooseDatabase({ DATABASE_URL: neon }, withPg('node', 'pg')).driver).toBe('pg');
    expect(chooseDatabase({ DATABASE_URL: local }, withPg('node', 'neon')).driver).toBe('neon');
  });

  it('on Workers: node-postgres through Hyperdrive when given pg, else straight; Neon\'s driver without pg', () => {
    expect(chooseDatabase({ HYPERDRIVE: hyperdrive, DATABASE_URL: local }, withPg('workerd'))).toEqual({
      driver: 'pg',
      connectionString: hyperdrive.connectionString,
      from: 'HYPERDRIVE',
    });
    expect(chooseDatabase({ DATABASE_URL: local }, withPg('workerd'))).toMatchObject({ driver: 'pg', from: 'DATABASE_URL' });
    expect(chooseDatabase({ DATABASE_URL: neon }, without('workerd'))).toMatchObject({ driver: 'neon', from: 'DATABASE_URL' });
    expect(chooseDatabase({ HYPERDRIVE: hyperdrive, DATABASE_URL: neon }, withPg('workerd', 'neon'))).toMatchObject({ driver: 'neon', connectionString: neon });
  });

  it('on an edge runtime: Neon\'s driver', () => {
    expect(chooseDatabase({ DATABASE_URL: local }, without('edge')).driver).toBe('neon');
  });

  it('refuses what cannot work with a ConfigError that names the fix and never a setting\'s value', () => {
    const cases: [string, () => unknown, RegExp][] = [
      ['Hyperdrive without pg', () => chooseDatabase({ HYPERDRIVE: hyperdrive }, without('workerd')), /pass it, createCloudflareWorker\(tasks, \{ pg \}\).*nodejs_compat/],
      ['pg asked, not given', () => chooseDatabase({ DATABASE_URL: local }, without('workerd', 'pg')), /nodejs_compat/],
      ['pg on the edge', () => chooseDatabase({ DATABASE_URL: local }, withPg('edge', 'pg')), /edge runtime.*Node\.js runtime/],
      ['no URL on a Worker', () => chooseDatabase({}, without('workerd')), /HYPERDRIVE.*DATABASE_URL.*\.dev\.vars/],
      ['no URL on Node', () => chooseDatabase({}, withPg('node')), /DATABASE_URL is not set/],
      ['a HYPERDRIVE that is not a binding', () => chooseDatabase({ HYPERDRIVE: 'postgres://x' }, withPg('workerd')), /\[\[hyperdrive\]\]/],
      ['an unknown driver', () => chooseDatabase({ DATABASE_URL: local }, withPg('node', 'mysql' as 'pg')), /'pg' or 'neon'/],
    ];
    for (const [what, attempt, message] of cases) {
      let thrown: unknown;
      try {
        attempt();
      } catch (err) {
        thrown = err;
      }
      expect(thrown, what).toBeInstanceOf(ConfigError);
      expect((thrown as Error).message, what).toMatch(message);
      expect((thrown as Error).message, what).not.toMatch(/secret-pw|gen-pw/);
    }
  });

  it('knows a Neon URL by its host', () => {
    expect(isNeonUrl(neon)).toBe(true);
    expect(isNeonUrl('postgres://u:p@ep-x.us-east-2.aws.neon.tech/db')).toBe(true);
    expect(isNeonUrl(local)).toBe(false);
    expect(isNeonUrl('postgres://u:p@neon.tech.evil.example/db')).toBe(false);
    expect(isNeonUrl('not a url')).toBe(false);
  });
});

describe("Neon's pool, when its WebSocket cannot open", () => {
  it('fails with an Error that says what it was opening, whatever the runtime reported (Node 24: an ErrorEvent with no message)', async () => {
    const { WebSocket: Ws } = await import('ws');
    const pool = neonPool({
      connectionString: 'postgres://app:secret-pw@db.internal.example:6543/app',
      wsProxy: '127.0.0.1:1/v1',
      // The runtime's own WebSocket where it has one (Node 22+), as the routes use it.
      webSocketConstructor: typeof globalThis.WebSocket === 'function' ? undefined : Ws,
      connectionTimeoutMillis: 5_000,
    });
    pool.on('error', () => undefined);
    const err = await pool.query('SELECT 1').then(
      () => undefined,
      (e: unknown) => e,
    );
    await pool.end().catch(() => undefined);
    expect(err).toBeInstanceOf(Error);
    const message = (err as Error).message;
    expect(message).toMatch(/db\.internal\.example:6543/);
    expect(message).toMatch(/ECONNREFUSED|network error|no reason|WebSocket/i);
    expect(message).not.toMatch(/secret-pw|non-Error thrown/);
  });
});
