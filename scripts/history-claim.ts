/**
 * Measures the claim with a large history (1,000,000 finished rows in
 * outlive.tasks), against the same claim on an empty table, and what
 * retention costs per batch when it deletes that history.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres node --import tsx scripts/history-claim.ts [rows]
 *
 * It creates a scratch database beside DATABASE_URL's and drops it after.
 */
import pg from 'pg';
import { applyRetention } from '../src/index.js';
import { migrate } from '../src/node/index.js';
import { claim, CLAIM_SQL } from '../src/pass/claim.js';
import { toExecutor } from '../src/db/executor.js';
import { scratchDatabase } from './local/scratch-db.js';

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

async function timeClaims(pool: pg.Pool, n: number): Promise<string> {
  const exec = toExecutor(pool);
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    await pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('probe', '{}', 1, 1000)`);
    const t0 = performance.now();
    const rows = await claim(exec, { owner: 'measure', limit: 10, maxTimeoutMs: 30_000, queues: null, names: ['probe'], leaseGraceMs: 5_000, leaseMs: 30_000, now: null });
    times.push(performance.now() - t0);
    if (rows.length !== 1) throw new Error(`claimed ${rows.length}, expected 1`);
    await pool.query(`UPDATE outlive.tasks SET state = 'succeeded', finished_at = now() WHERE id = $1`, [rows[0]!.id]);
  }
  const s = times.sort((a, b) => a - b);
  // The statement's own time in the server, without the round trip and the
  // commit's fsync that dominate the client-side number on a busy machine.
  const server: number[] = [];
  const client = await pool.connect();
  try {
    for (let i = 0; i < 50; i++) {
      await client.query('BEGIN');
      await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('probe', '{}', 1, 1000)`);
      const { rows } = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${CLAIM_SQL}`, [null, 30_000, null, 10, 'measure', 5_000, 30_000]);
      server.push(rows[0]['QUERY PLAN'][0]['Execution Time']);
      await client.query('ROLLBACK');
    }
  } finally {
    client.release();
  }
  const e = server.sort((a, b) => a - b);
  return (
    `p50 ${percentile(s, 50).toFixed(2)} ms, p95 ${percentile(s, 95).toFixed(2)} ms, p99 ${percentile(s, 99).toFixed(2)} ms (n=${n}); ` +
    `in the server p50 ${percentile(e, 50).toFixed(3)} ms`
  );
}

async function main(): Promise<void> {
  const total = Number(process.argv[2] ?? 1_000_000);
  const scratch = await scratchDatabase('outlive_history');
  const url = scratch.url;
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  try {
    await migrate(url);
    console.log(`claim, empty history:        ${await timeClaims(pool, 200)}`);
    let t = performance.now();
    // Finished rows, as a busy month leaves them: most succeeded, some failed, aged 0-30 days.
    await pool.query(
      `INSERT INTO outlive.tasks (name, state, input, output, attempts, max_attempts, timeout_ms, created_at, started_at, finished_at)
       SELECT 'history', CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'succeeded' END::outlive.task_state,
              jsonb_build_object('n', g), jsonb_build_object('ok', true), 1, 5, 15000, at, at, at
       FROM generate_series(1, $1::int) AS g, LATERAL (SELECT now() - (g % 30) * interval '1 day' - (g % 86400) * interval '1 second' AS at) a`,
      [total],
    );
    await pool.query('VACUUM ANALYZE outlive.tasks');
    console.log(`inserted ${total} finished rows in ${((performance.now() - t) / 1000).toFixed(1)} s`);
    console.log(`claim, ${total} finished rows: ${await timeClaims(pool, 200)}`);

    // Retention over that history: the defaults (7 days succeeded, 30 failed).
    t = performance.now();
    let calls = 0;
    let deleted = 0;
    let batches = 0;
    const perCall: number[] = [];
    for (;;) {
      const r = await applyRetention(pool, { batchSize: 500, maxRows: 10_000 });
      calls++;
      batches += r.batches;
      deleted += r.tasks;
      perCall.push(r.durationMs);
      if (!r.more) break;
    }
    const s = perCall.sort((a, b) => a - b);
    console.log(
      `retention: deleted ${deleted} rows in ${calls} calls (${batches} batches of <= 500) in ${((performance.now() - t) / 1000).toFixed(1)} s; ` +
        `per 10,000-row call p50 ${percentile(s, 50)} ms, max ${s.at(-1)} ms`,
    );
    await pool.query('VACUUM ANALYZE outlive.tasks');
    console.log(`claim, after retention:      ${await timeClaims(pool, 200)}`);
  } finally {
    await pool.end();
    await scratch.drop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
