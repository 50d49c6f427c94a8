/**
 * Measures a Prometheus scrape of `GET /dashboard/metrics` at 1,000,000
 * tasks: mostly finished history (a week of it, 20 tasks a second for the
 * last hour, so the 300 s window holds 6,000), and thousands live (ready,
 * scheduled, running, parked waits, tasks blocked on a limit). Reports the
 * handler's wall time and this process's CPU per scrape, the server's
 * execution time of each statement (EXPLAIN ANALYZE), and the overview's
 * count by state over the same table for comparison.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres node --conditions=outlive-source --import tsx scripts/metrics-scrape.ts [rows] [ready]
 *
 * `ready` (default 5,000) sets the backlog of ready tasks among the rows.
 *
 * It creates a scratch database beside DATABASE_URL's and drops it after.
 */
import pg from 'pg';
import { migrate } from '../src/node/index.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { METRICS_STATEMENTS, metricsParams, metricsSnapshot } from '../src/admin/metrics.js';
import { status } from '../src/admin/queries.js';
import { scratchDatabase } from './local/scratch-db.js';

const TOKEN = 'measure-metrics-token-0123456789';

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function seed(pool: pg.Pool, total: number, ready: number): Promise<void> {
  const live = { ready, scheduled: 2_000, running: 200, waits: 1_000, blocked: 1_000 };
  const recent = 72_000; // 20/s over the last hour
  const history = total - recent - Object.values(live).reduce((a, b) => a + b, 0);
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, state, input, output, attempts, max_attempts, timeout_ms, created_at, run_at, started_at, finished_at)
     SELECT 'history', 'q' || (g % 8), CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'succeeded' END::outlive.task_state,
            jsonb_build_object('n', g), jsonb_build_object('ok', true), 1, 5, 15000, at, at, at + interval '20 ms', at + interval '200 ms'
     FROM generate_series(1, $1::int) AS g,
          LATERAL (SELECT now() - interval '1 hour' - (g % 7) * interval '1 day' - (g % 86400) * interval '1 second' AS at) a`,
    [history],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, state, input, attempts, max_attempts, timeout_ms, created_at, run_at, started_at, finished_at)
     SELECT 'recent', 'q' || (g % 8), CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END::outlive.task_state,
            '{}', 1, 5, 15000, at, at, at + (g % 100) * interval '1 ms', at + (g % 1000) * interval '1 ms'
     FROM generate_series(1, $1::int) AS g, LATERAL (SELECT now() - g * interval '50 ms' AS at) a`,
    [recent],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, run_at)
     SELECT 'ready', 'q' || (g % 8), '{}', 3, 15000, now() - (g % 600) * interval '1 second' FROM generate_series(1, $1::int) g`,
    [live.ready],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, run_at)
     SELECT 'later', 'q' || (g % 8), '{}', 3, 15000, now() + (g % 3600) * interval '1 second' FROM generate_series(1, $1::int) g`,
    [live.scheduled],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, state, input, attempts, max_attempts, timeout_ms, run_at, started_at, lease_owner, lease_expires_at)
     SELECT 'busy', 'q' || (g % 8), 'running', '{}', 1, 3, 15000, now(), now(), 'pass-' || (g % 4), now() + interval '1 minute'
     FROM generate_series(1, $1::int) g`,
    [live.running],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, run_at, wait_key, wait_until, snoozes)
     SELECT '$wait', 'q' || (g % 8), jsonb_build_object('key', 'order:' || g, 'timeoutMs', 86400000), 4, 15000,
            now() + interval '1 day', 'order:' || g, now() + interval '1 day', 1
     FROM generate_series(1, $1::int) g`,
    [live.waits],
  );
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, run_at, fair_key, limits, vt, blocked_on)
     SELECT 'governed', 'q' || (g % 8), '{}', 3, 15000, now() - interval '1 minute', '', '[{"k":"api","n":5}]', g, 'api'
     FROM generate_series(1, $1::int) g`,
    [live.blocked],
  );
  await pool.query(`VACUUM ANALYZE outlive.tasks`);
}

async function main(): Promise<void> {
  const total = Number(process.argv[2] ?? 1_000_000);
  const ready = Number(process.argv[3] ?? 5_000);
  const scratch = await scratchDatabase('outlive_metrics');
  const pool = new pg.Pool({ connectionString: scratch.url, max: 4 });
  // The drop ends the pool's idle connections from the server's side.
  pool.on('error', () => {});
  try {
    await migrate(scratch.url);
    let t = performance.now();
    await seed(pool, total, ready);
    const [{ n }] = (await pool.query(`SELECT count(*)::int AS n FROM outlive.tasks`)).rows;
    console.log(`seeded ${n} rows in ${((performance.now() - t) / 1000).toFixed(1)} s`);

    const scrape = () => handleDashboard(new Request('http://measure/dashboard/metrics', { headers: { authorization: `Bearer ${TOKEN}` } }), pool, { token: TOKEN });
    for (let i = 0; i < 3; i++) await (await scrape()).text(); // warm the connections and the cache
    const wall: number[] = [];
    const cpu: number[] = [];
    let bytes = 0;
    for (let i = 0; i < 30; i++) {
      const c0 = process.cpuUsage();
      t = performance.now();
      const res = await scrape();
      const body = await res.text();
      wall.push(performance.now() - t);
      const c = process.cpuUsage(c0);
      cpu.push((c.user + c.system) / 1000);
      if (res.status !== 200) throw new Error(`scrape answered ${res.status}`);
      bytes = body.length;
    }
    console.log(`GET /metrics: wall p50 ${median(wall).toFixed(1)} ms, max ${Math.max(...wall).toFixed(1)} ms; handler CPU p50 ${median(cpu).toFixed(2)} ms; ${bytes} bytes`);

    const params = metricsParams();
    let server = 0;
    const client = await pool.connect();
    try {
      for (const [name, text] of Object.entries(METRICS_STATEMENTS)) {
        const times: number[] = [];
        const buffers: number[] = [];
        for (let i = 0; i < 10; i++) {
          // Planned as metricsSnapshot plans it: in a transaction with sequential scans priced out.
          await client.query('BEGIN');
          await client.query(`SELECT pg_catalog.set_config('enable_seqscan', 'off', true), pg_catalog.set_config('jit', 'off', true)`);
          const [{ 'QUERY PLAN': [plan] }] = (await client.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${text}`, params[name as keyof typeof params])).rows;
          await client.query('COMMIT');
          times.push(plan['Execution Time'] + plan['Planning Time']);
          buffers.push((plan.Plan['Shared Hit Blocks'] ?? 0) + (plan.Plan['Shared Read Blocks'] ?? 0));
        }
        server += median(times);
        console.log(`  ${name}: server p50 ${median(times).toFixed(2)} ms (planning + execution, under EXPLAIN ANALYZE), ${median(buffers)} buffers`);
      }
    } finally {
      client.release();
    }
    console.log(`  all three: ${server.toFixed(2)} ms of Postgres time per scrape`);
    const snap: number[] = [];
    for (let i = 0; i < 20; i++) {
      t = performance.now();
      await metricsSnapshot(pool);
      snap.push(performance.now() - t);
    }
    console.log(`metricsSnapshot() alone (BEGIN, settings, three statements, COMMIT): wall p50 ${median(snap).toFixed(1)} ms`);

    const counts: number[] = [];
    for (let i = 0; i < 5; i++) {
      t = performance.now();
      await status(pool);
      counts.push(performance.now() - t);
    }
    console.log(`for comparison, the overview's status() (count by queue and state over the table): p50 ${median(counts).toFixed(1)} ms`);
  } finally {
    await pool.end();
    await scratch.drop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
