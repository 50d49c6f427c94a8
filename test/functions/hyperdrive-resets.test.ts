/**
 * A Worker killed while its Hyperdrive connection carries bytes: workerd's
 * socket is reset under Miniflare's Hyperdrive proxy, which has no error
 * listener of its own (test/support/miniflare-sockets.ts gives it one). Were
 * the reset uncaught, vitest would fail this file with an unhandled error
 * though its assertions pass; npm start would die. Without the listener, 7
 * of 8 such kills were uncaught here.
 */
import { build } from 'esbuild';
import { describe, expect, it } from 'vitest';
import { nodeBuiltins } from '../../scripts/local/bundle.js';
import { freshDb } from '../support/db.js';
import { roleUrl, waitFor } from '../support/functions-db.js';
import { startWorker, workerDatabase } from '../support/worker.js';

const db = await freshDb();
const { url } = await roleUrl(db);
const role = new URL(url).username;

const QUERY_FOREVER = `
import pg from 'pg';
export default {
  async fetch(request, env) {
    const pool = new pg.Pool({ connectionString: env.HYPERDRIVE.connectionString, max: 2 });
    for (;;) await pool.query("SELECT repeat('x', 200000)");
  },
};`;

describe('a Worker killed mid-query behind a Hyperdrive binding', () => {
  it('leaves no uncaught reset and no connection behind, kill after kill', async () => {
    const script = (
      await build({
        stdin: { contents: QUERY_FOREVER, resolveDir: process.cwd(), loader: 'js' },
        bundle: true,
        format: 'esm',
        platform: 'neutral',
        conditions: ['workerd', 'worker', 'browser'],
        mainFields: ['module', 'main'],
        write: false,
        plugins: [nodeBuiltins],
        logLevel: 'silent',
      })
    ).outputFiles[0]!.text;
    const database = await workerDatabase('hyperdrive', url);
    try {
      for (let i = 0; i < 5; i++) {
        const worker = await startWorker(script, {}, database.options);
        void worker.fetch('/').catch(() => undefined);
        await waitFor(async () => database.open > 0, 10_000, 'the Worker to connect');
        await new Promise((r) => setTimeout(r, 300));
        await worker.dispose();
      }
      await waitFor(async () => database.open === 0, 20_000, 'the connections to close');
      await waitFor(
        async () => (await db.rows(`SELECT 1 FROM pg_stat_activity WHERE usename = $1`, [role])).length === 0,
        20_000,
        'the backends to end',
      );
      expect(database.open).toBe(0);
    } finally {
      await database.close();
    }
  }, 120_000);
});
