/**
 * `npm run load [-- --seconds N] [-- --rate N] [-- --autovacuum default|tuned] [-- --naptime 10s] [-- --seed N]`
 *
 * Sustained load on an embedded PostgreSQL of its own: a producer enqueues
 * at a steady rate while several passes claim and settle at once, history
 * grows (a pre-filled backlog of old finished rows, plus everything the run
 * finishes) and retention runs every few seconds. Every 5 s it samples the
 * claim statement (CLAIM_SQL under EXPLAIN ANALYZE, in a transaction rolled
 * back), the table's size and its live and dead tuples (pg_stat_user_tables),
 * and prints them; at the end, a summary of first against last samples.
 *
 * `--autovacuum tuned` applies the per-table settings docs/reliability.md
 * recommends before the run; `default` leaves the server's.
 */
import pg from 'pg';
import { z } from 'zod';
import { applyRetention, defineTask, enqueueMany, tick } from '../src/index.js';
import { migrate } from '../src/node/index.js';
import { CLAIM_SQL } from '../src/pass/claim.js';
import { startOwnPostgres } from './lib/postgres.js';
import { prng, seedFromArgs } from './lib/prng.js';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] ? process.argv[i + 1]! : fallback;
}

const seconds = Number(arg('seconds', '240'));
const rate = Number(arg('rate', '600'));
const autovacuum = arg('autovacuum', 'tuned');
const history = Number(arg('history', '200000'));
/** Server-wide autovacuum_naptime to set (e.g. 10s); default: the server's (1 min). */
const naptime = arg('naptime', '');
const seed = seedFromArgs(process.argv);
const rng = prng(seed);

/** The per-table settings recommended for outlive.tasks (see docs/reliability.md). */
export const TUNED_AUTOVACUUM = `ALTER TABLE outlive.tasks SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0)`;

const server = await startOwnPostgres('.data/load-pg');
const url = server.url('postgres');
await migrate(url);
const pool = new pg.Pool({ connectionString: url, max: 20 });
pool.on('error', () => {});
if (autovacuum === 'tuned') await pool.query(TUNED_AUTOVACUUM);
if (naptime) {
  await pool.query(`ALTER SYSTEM SET autovacuum_naptime = '${naptime.replace(/[^0-9a-z]/g, '')}'`);
  await pool.query('SELECT pg_reload_conf()');
}

// History: old finished rows, as months of use leave them, for retention to eat through.
await pool.query(
  `INSERT INTO outlive.tasks (name, queue, state, input, output, attempts, max_attempts, timeout_ms, run_at, created_at, updated_at, started_at, finished_at)
   SELECT 'load.job', 'default', 'succeeded', jsonb_build_object('n', g), '{"ok": true}', 1, 5, 15000, t, t, t, t, t
   FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '8 days' - g * interval '1 second' AS t) x`,
  [history],
);
await pool.query('ANALYZE outlive.tasks');

const job = defineTask({
  name: 'load.job',
  input: z.object({ n: z.number().int(), work: z.number().int() }),
  timeoutMs: 5_000,
  retry: { maxAttempts: 3, backoff: { baseMs: 200 } },
  async run({ n, work }) {
    if (work > 0) await new Promise((r) => setTimeout(r, work));
    return { n };
  },
});

const started = Date.now();
const ends = started + seconds * 1_000;
let enqueued = 0;
let processed = 0;
let retention = { tasks: 0, calls: 0 };

const producer = async () => {
  let n = 0;
  const batch = Math.max(1, Math.round(rate / 10));
  while (Date.now() < ends) {
    const inputs = Array.from({ length: batch }, () => ({ n: n++, work: rng.chance(0.1) ? rng.int(5, 50) : 0 }));
    await enqueueMany(pool, job, inputs);
    enqueued += inputs.length;
    await new Promise((r) => setTimeout(r, Math.max(0, started + (enqueued / rate) * 1_000 - Date.now())));
  }
};

const passes = async (id: number) => {
  while (Date.now() < ends) {
    const r = await tick(pool, { tasks: [job], budgetMs: 10_000, concurrency: 20, owner: `load-${id}`, recover: id === 0 });
    processed += r.succeeded;
    if (r.claimed === 0) await new Promise((res) => setTimeout(res, 50));
  }
};

const retainer = async () => {
  while (Date.now() < ends) {
    // Keeps a minute of finished history from this run; the pre-filled backlog is older than the default 7 days.
    const r = await applyRetention(pool, { succeededMs: 60_000 });
    retention = { tasks: retention.tasks + r.tasks, calls: retention.calls + 1 };
    await new Promise((res) => setTimeout(res, r.more ? 200 : 5_000));
  }
};

interface Sample {
  t: number;
  claimMs: number;
  claimPlanRows: number;
  pending: number;
  live: number;
  dead: number;
  sizeMb: number;
  claimIdxKb: number;
  autovacuums: number;
  enqueued: number;
  processed: number;
  retained: number;
}
const samples: Sample[] = [];

const sampler = async () => {
  while (Date.now() < ends) {
    await new Promise((res) => setTimeout(res, 5_000));
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const plan = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${CLAIM_SQL}`, [null, 60_000, null, 10, 'sampler', 1_000, 30_000]);
      await client.query('ROLLBACK');
      const p = plan.rows[0]['QUERY PLAN'][0];
      const stats = (
        await client.query(`SELECT n_live_tup::int AS live, n_dead_tup::int AS dead, autovacuum_count::int AS av,
                                   pg_total_relation_size('outlive.tasks') AS size, pg_relation_size('outlive.tasks_claim_idx') AS idx,
                                   (SELECT count(*)::int FROM outlive.tasks WHERE state = 'pending') AS pending
                            FROM pg_stat_user_tables WHERE relid = 'outlive.tasks'::regclass`)
      ).rows[0];
      const s: Sample = {
        t: Math.round((Date.now() - started) / 1000),
        claimMs: Math.round(p['Execution Time'] * 100) / 100,
        claimPlanRows: p.Plan['Actual Rows'] ?? 0,
        pending: stats.pending,
        live: stats.live,
        dead: stats.dead,
        sizeMb: Math.round(Number(stats.size) / 1048576),
        claimIdxKb: Math.round(Number(stats.idx) / 1024),
        autovacuums: stats.av,
        enqueued,
        processed,
        retained: retention.tasks,
      };
      samples.push(s);
      console.log(JSON.stringify(s));
    } finally {
      client.release();
    }
  }
};

console.log(`load: ${seconds} s at ${rate} tasks/s, ${history} rows of history, autovacuum ${autovacuum}${naptime ? `, naptime ${naptime}` : ''}, seed ${seed}`);
await Promise.all([producer(), passes(0), passes(1), passes(2), retainer(), sampler()]);

const quarter = Math.max(1, Math.floor(samples.length / 4));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const first = samples.slice(0, quarter);
const last = samples.slice(-quarter);
const summary = {
  seconds: Math.round((Date.now() - started) / 1000),
  enqueued,
  processed,
  throughput: Math.round(processed / ((Date.now() - started) / 1000)),
  retentionDeleted: retention.tasks,
  claimMsMedianFirstQuarter: median(first.map((s) => s.claimMs)),
  claimMsMedianLastQuarter: median(last.map((s) => s.claimMs)),
  claimMsMax: Math.max(...samples.map((s) => s.claimMs)),
  deadTuplesMax: Math.max(...samples.map((s) => s.dead)),
  deadTuplesLast: samples.at(-1)?.dead,
  liveTuplesLast: samples.at(-1)?.live,
  pendingMax: Math.max(...samples.map((s) => s.pending)),
  sizeMbFirst: samples[0]?.sizeMb,
  sizeMbMax: Math.max(...samples.map((s) => s.sizeMb)),
  sizeMbLast: samples.at(-1)?.sizeMb,
  claimIdxKbMax: Math.max(...samples.map((s) => s.claimIdxKb)),
  autovacuums: samples.at(-1)?.autovacuums,
};
console.log(`summary ${JSON.stringify(summary, null, 2)}`);
await pool.end();
await server.stop();
