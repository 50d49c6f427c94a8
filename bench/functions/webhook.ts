/**
 * Measures the serverless path (issue 4):
 *
 * 1. enqueue-to-start latency through the webhook: the Worker bundled and run
 *    in Miniflare (workerd), nudged after each enqueue commits; latency is the
 *    task's `started_at - created_at`, both on the database clock. Each nudge
 *    is a new invocation, so it includes opening the invocation's pool (a
 *    WebSocket and a Postgres backend);
 * 2. database round trips per task in one pass over the Neon WebSocket driver
 *    (every query the pass sends, counted at the pool).
 *
 * Run: TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx bench/functions/webhook.ts [tasks]
 * (without TEST_DATABASE_URL it starts an embedded PostgreSQL).
 */
import pg from 'pg';
import { WebSocket } from 'ws';
import { z } from 'zod';
import { enqueue, enqueueMany } from '../../src/write/enqueue.js';
import type { PoolClientLike, PoolLike } from '../../src/db/executor.js';
import { migrate } from '../../src/node/migrate.js';
import { neonPool } from '../../src/db/neon.js';
import { nudge } from '../../src/http/nudge.js';
import { defineTask } from '../../src/model/task.js';
import { tick } from '../../src/pass/tick.js';
import { definitions } from '../../test/support/function-tasks.js';
import { startPostgres } from '../../test/support/postgres.js';
import { bundleWorker, startWorker } from '../../test/support/worker.js';
import { startWsProxy } from '../../test/support/ws-proxy.js';

const N = Number(process.argv[2] ?? 100);
const server = await startPostgres({ url: process.env.TEST_DATABASE_URL, dataDir: '.data/bench-functions-pg' });
const dbName = `outlive_bench_fn_${process.pid}`;
const admin = new pg.Client({ connectionString: server.url });
await admin.connect();
await admin.query(`CREATE DATABASE ${dbName}`);
const url = server.urlFor(dbName);
await migrate(url);
const pool = new pg.Pool({ connectionString: url });
await pool.query(`CREATE TABLE effects (task_id bigint NOT NULL, label text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (task_id, label))`);
const target = new URL(url);
const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
const secret = crypto.randomUUID() + crypto.randomUUID();

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}
function summary(ms: number[]) {
  const s = [...ms].sort((a, b) => a - b);
  return `p50 ${percentile(s, 50).toFixed(1)} ms, p99 ${percentile(s, 99).toFixed(1)} ms, min ${s[0]!.toFixed(1)}, max ${s.at(-1)!.toFixed(1)} (n=${s.length})`;
}
async function latencies(ids: string[]): Promise<number[]> {
  const { rows } = await pool.query(
    `SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms FROM outlive.tasks WHERE id = ANY($1::bigint[])`,
    [ids],
  );
  return rows.map((r) => Number(r.ms));
}
async function waitStarted(ids: string[]) {
  for (;;) {
    const { rows } = await pool.query(`SELECT count(*)::int AS n FROM outlive.tasks WHERE id = ANY($1::bigint[]) AND state = 'succeeded'`, [ids]);
    if (rows[0].n === ids.length) return;
    await new Promise((r) => setTimeout(r, 2));
  }
}

const defs = definitions(null);
const worker = await startWorker(await bundleWorker('test/support/function-tasks.ts', 'neon'), {
  DATABASE_URL: url,
  NEON_WS_PROXY: proxy.address,
  OUTLIVE_DRAIN_SECRET: secret,
});
try {
  // Warm-up: the first invocation compiles the Worker.
  await enqueue(pool, defs.record, { n: -1 });
  await nudge(worker.url('/drain'), secret, '', { respondAsync: false });

  // 1a. One at a time on an idle system: enqueue (committed), nudge, wait
  // until it ran, then let the pass finish and its pool close.
  const idle: string[] = [];
  for (let i = 0; i < N; i++) {
    const t = await enqueue(pool, defs.record, { n: i });
    const r = await nudge(worker.url('/drain'), secret);
    if (!r.delivered) throw new Error(`nudge not delivered: ${r.status}`);
    await waitStarted([t.id]);
    idle.push(t.id);
    await new Promise((r) => setTimeout(r, 250));
  }
  console.log(`webhook, one at a time, idle:        ${summary(await latencies(idle))}`);

  // 1b. Back to back: the next enqueue and nudge as soon as the last task ran
  // (its pass is still finishing, its pool still closing).
  const backToBack: string[] = [];
  for (let i = 0; i < N; i++) {
    const t = await enqueue(pool, defs.record, { n: 10_000 + i });
    const r = await nudge(worker.url('/drain'), secret);
    if (!r.delivered) throw new Error(`nudge not delivered: ${r.status}`);
    await waitStarted([t.id]);
    backToBack.push(t.id);
  }
  console.log(`webhook, one at a time, back to back: ${summary(await latencies(backToBack))}`);

  // 1c. N tasks committed in one transaction, one nudge: the pass's own pace
  // (concurrency 10) shows in the tail.
  const many = (await enqueueMany(pool, defs.record, Array.from({ length: N }, (_, i) => ({ n: 20_000 + i })))).map((t) => t.id);
  await nudge(worker.url('/drain'), secret);
  await waitStarted(many);
  console.log(`webhook, ${N} tasks in one commit, one nudge: ${summary(await latencies(many))}`);
} finally {
  await worker.dispose();
}

// 2. Round trips per task in one pass over the Neon driver, counted at the pool.
const noop = defineTask({ name: 'noop', input: z.object({ i: z.number() }), run: () => null });
for (const [tasks, concurrency] of [
  [1, 10],
  [10, 10],
  [100, 10],
  [N * 5, 25],
] as const) {
  const neon = neonPool({ connectionString: url, wsProxy: proxy.address, webSocketConstructor: WebSocket, max: 5 });
  let queries = 0;
  const kinds: Record<string, number> = {};
  const count = (text: string) => {
    queries++;
    const kind = /WITH expired AS/.test(text) ? 'recover' : /WITH ready AS/.test(text) ? 'claim' : /SET state = s\.state/.test(text) ? 'settle' : text.trim().split(/\s+/).slice(0, 3).join(' ');
    kinds[kind] = (kinds[kind] ?? 0) + 1;
  };
  const counted: PoolLike = {
    query: (text, params) => {
      count(text);
      return neon.query(text, params);
    },
    connect: async () => {
      const client = await neon.connect();
      return {
        query: (text: string, params?: unknown[]) => {
          count(text);
          return client.query(text, params);
        },
        release: (err?: Error | boolean) => client.release(err),
      } as PoolClientLike;
    },
  };
  const client = await pool.connect();
  await client.query('BEGIN');
  for (let i = 0; i < tasks; i++) await enqueue(client, noop, { i });
  await client.query('COMMIT');
  client.release();
  const report = await tick(counted, { tasks: [noop], concurrency });
  await neon.end();
  console.log(
    `pass over the Neon driver: ${tasks} tasks, concurrency ${concurrency}: ${queries} round trips ${JSON.stringify(kinds)} ` +
      `(${(queries / tasks).toFixed(2)} per task; claimed ${report.claimed}, succeeded ${report.succeeded}, ${report.durationMs} ms)`,
  );
}

await pool.end();
await proxy.close();
await admin.query(`DROP DATABASE ${dbName} WITH (FORCE)`);
await admin.end();
await server.stop();
