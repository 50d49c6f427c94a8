/**
 * outlive as the harness drives it, imported from the working tree
 * (`../../src/index.ts`, through tsx on the machine's Node).
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import type PgModule from 'pg';
import { z } from 'zod';
import * as core from '../../src/index.ts';
import * as node from '../../src/node/index.ts';
import { toExecutor } from '../../src/db/executor.ts';

const outlive = { ...core, ...node, toExecutor };
import { claim, CLAIM_SQL } from '../../src/pass/claim.ts';
import type { Driver, Payload, WorkerSettings } from './protocol.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

// The repository's node-postgres, the one the engine imports: createWorker
// checks `pool instanceof pg.Pool` against it, and child.ts counts its queries.
const pg = createRequire(`${ROOT}/package.json`)('pg') as typeof PgModule;
type Pool = PgModule.Pool;
type PoolClient = PgModule.PoolClient;

// Errors only: a benchmark should not measure console output.
const quiet: node.WorkerLogger = {
  info: () => undefined,
  warn: (m) => console.warn(m),
  error: (m) => console.error(m),
};

/** The worker's pool size, as createWorker sizes its own pool: concurrency + 2. */
const poolSize = (concurrency: number) => concurrency + 2;

const payloadSchema = z.object({ i: z.number().int().nonnegative(), t: z.number().optional(), sleepMs: z.number().int().nonnegative().optional() });

/**
 * The timeout of a job whose handler waits `sleepMs` (the liveness phase):
 * the task's default (15 s) would cut a 20-s wait short. At 30 s or more the
 * lease is the pass's default, 30 s plus 5 s of grace (src/pass/tick.ts).
 */
const longTimeoutMs = (sleepMs: number) => Math.max(60_000, 2 * sleepMs);

/**
 * The most connections a worker's pool may open. createWorker sizes its own
 * pool at concurrency + 2 (12 at the harness's usual 10); at the liveness
 * phase's concurrency of 1,000 that would allow more connections than the
 * server has (max_connections 100, shared), so there the worker is given a
 * pool of this size instead. Its handlers never use the pool.
 */
export const OUTLIVE_MAX_POOL = 12;
const rootSchema = z.object({ i: z.number().int().nonnegative(), spawn: z.number().int().nonnegative() });

/**
 * The tasks of the DAG phase. `run` counts each execution. A root started
 * with `spawn: n` adds n leaves and a join waiting for all of them to its
 * run from inside its handler (ctx.spawn, written in the root's settle);
 * with `spawn: 0` the graph was written up front by startRun.
 */
function dagTasks(run: (p: Payload) => void | Promise<void>) {
  const leaf = outlive.defineTask({ name: 'dag-leaf', input: payloadSchema, run: (input) => run(input) });
  const join = outlive.defineTask({ name: 'dag-join', input: payloadSchema, run: (input) => run(input) });
  const root = outlive.defineTask({
    name: 'dag-root',
    input: rootSchema,
    run: ({ i, spawn }, ctx) => {
      run({ i });
      if (spawn === 0) return;
      const leaves: string[] = [];
      for (let k = 1; k <= spawn; k++) {
        leaves.push(`leaf:${k}`);
        ctx.spawn(`leaf:${k}`, outlive.step(leaf, { i: k }));
      }
      ctx.spawn('join', outlive.step(join, { i: spawn + 1 }, { after: leaves }));
    },
  });
  return { root, leaf, join };
}

/**
 * Starts the DAG phase's run: a root, `leaves` tasks after it and a join
 * after all of them (payload indexes 0, 1..leaves, leaves + 1). With
 * `spawned`, only the root is written here and it spawns the rest.
 */
export async function startDagRun(url: string, leaves: number, spawned: boolean): Promise<{ ms: number; runId: string }> {
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: 'bench-outlive-dag' });
  try {
    const { root, leaf, join } = dagTasks(() => undefined);
    const steps: Record<string, core.Step> = { root: outlive.step(root, { i: 0, spawn: spawned ? leaves : 0 }) };
    if (!spawned) {
      const names: string[] = [];
      for (let k = 1; k <= leaves; k++) {
        names.push(`leaf:${k}`);
        steps[`leaf:${k}`] = outlive.step(leaf, { i: k }, { after: ['root'] });
      }
      steps.join = outlive.step(join, { i: leaves + 1 }, { after: names });
    }
    const started = performance.now();
    const run = await outlive.startRun(pool, 'bench-fan-out', steps);
    return { ms: performance.now() - started, runId: run.id };
  } finally {
    await pool.end();
  }
}

/** How the bench task is defined: outlive-drop is outlive with `keepSucceeded: false`. */
export interface OutliveOptions {
  keepSucceeded?: boolean;
}

/** Creates the outlive driver (the outlive-drop one with `{ keepSucceeded: false }`). */
export function createDriver(options: OutliveOptions = {}): Driver {
  const keepSucceeded = options.keepSucceeded ?? true;
  let url = '';
  let pool: Pool | null = null;
  let txClient: PoolClient | null = null;
  let worker: node.Worker | null = null;
  let workerPool: Pool | null = null;
  let noop: core.AnyTask | null = null;
  const task = (run: (p: Payload) => void | Promise<void> = () => undefined) =>
    outlive.defineTask({ name: 'noop', input: payloadSchema, keepSucceeded, run: (input) => run(input) });

  const driver: Driver = {
    name: keepSucceeded ? 'outlive' : 'outlive-drop',
    version: () => JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')).version + ' (working tree)',
    settings: (concurrency) =>
      `createWorker({ connectionString, concurrency: ${concurrency} }) (src/node/worker.ts: LISTEN outlive, tick passes, ` +
      `its own pg.Pool of ${poolSize(concurrency)}); other options at their defaults (pollIntervalMs 2,000, retention on)` +
      (keepSucceeded ? '' : `; the task defined with keepSucceeded: false (a success's row is deleted by its settle)`),
    async install(target) {
      await outlive.migrate(target);
    },
    async open(target) {
      url = target;
      // The pool is made here, from the harness's pg, so that the query
      // counter in child.ts sees every statement the engine sends.
      pool = new pg.Pool({ connectionString: url, max: 12, application_name: 'bench-outlive' });
      await pool.query('SELECT 1');
      noop = task();
    },
    async enqueueOne(payload) {
      // A pool is a Queryable: the insert commits on its own, as the
      // peers' one-job calls do.
      await outlive.enqueue(pool!, noop!, payload);
    },
    async enqueueOneInTransaction(payload) {
      txClient ??= await pool!.connect();
      await txClient.query('BEGIN');
      await outlive.enqueue(txClient, noop!, payload);
      await txClient.query('COMMIT');
    },
    async enqueueMany(payloads) {
      // A loop, not Math.max(...spread): a spread of 300,000 arguments overflows the stack.
      let longest = 0;
      for (const p of payloads) longest = Math.max(longest, p.sleepMs ?? 0);
      await outlive.enqueueMany(pool!, noop!, payloads, longest > 0 ? { timeoutMs: longTimeoutMs(longest) } : {});
    },
    async startWorker(settings: WorkerSettings, run) {
      // The engine's own long-lived worker, with its own pool (as an app would run it).
      const dag = dagTasks(run);
      const capped = poolSize(settings.concurrency) > OUTLIVE_MAX_POOL;
      workerPool = capped ? new pg.Pool({ connectionString: url, max: OUTLIVE_MAX_POOL, application_name: 'bench-outlive-worker' }) : null;
      workerPool?.on('error', (err) => console.warn(`outlive worker pool: ${err.message}`));
      worker = outlive.createWorker({
        ...(workerPool ? { pool: workerPool } : { connectionString: url }),
        tasks: [task(run), dag.root, dag.leaf, dag.join],
        concurrency: settings.concurrency,
        logger: quiet,
      });
      await worker.start();
    },
    async stopWorker() {
      await worker?.stop();
      worker = null;
      // A pool given to createWorker is the giver's to close.
      await workerPool?.end();
      workerPool = null;
    },
    async close() {
      txClient?.release();
      txClient = null;
      await pool?.end();
      pool = null;
    },
  };
  return driver;
}

/** Settings of the claim-time phase. */
export interface ClaimTimeSettings {
  finished: number;
  pending: number;
  /** Claims timed, each of `limit` tasks, each committed (so each takes the next ready rows). */
  reps: number;
  limit: number;
}

/** What the claim-time phase measured. */
export interface ClaimTimeResult {
  /** Client-side wall time of each claim statement (one round trip), in ms. */
  timesMs: number[];
  /** EXPLAIN (ANALYZE, BUFFERS) of one claim, run in a transaction that was rolled back. */
  plan: string;
  planningMs: number | null;
  executionMs: number | null;
  fillMs: number;
}

/**
 * Times the claim as a worker sends it (a call of `outlive.claim`, whose body
 * is `CLAIM_SQL` of src/pass/claim.ts) on a table holding `finished` succeeded
 * rows and `pending` ready rows, written directly with generate_series (the
 * rows are what enqueue and settle would leave; writing them through the API
 * would take minutes and measure something else).
 */
export async function claimTime(url: string, s: ClaimTimeSettings): Promise<ClaimTimeResult> {
  const pool = new pg.Pool({ connectionString: url, max: 2, application_name: 'bench-outlive-claim' });
  try {
    const fillStarted = performance.now();
    if (s.finished > 0) {
      await pool.query(
        `INSERT INTO outlive.tasks (name, queue, state, input, output, attempts, max_attempts, timeout_ms,
                                    run_at, started_at, finished_at, created_at, updated_at)
         SELECT 'noop', 'default', 'succeeded', jsonb_build_object('i', g), 'null'::jsonb, 1, 5, 15000,
                t, t, t, t, t
         FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '2 days' + g * interval '100 ms') AS x(t)`,
        [s.finished],
      );
    }
    if (s.pending > 0) {
      await pool.query(
        `INSERT INTO outlive.tasks (name, queue, state, input, max_attempts, timeout_ms, run_at)
         SELECT 'noop', 'default', 'pending', jsonb_build_object('i', g), 5, 15000,
                now() - interval '1 hour' + g * interval '1 ms'
         FROM generate_series(1, $1::int) g`,
        [s.pending],
      );
    }
    // The server runs with autovacuum off; give the planner the statistics
    // autovacuum would have gathered after so many inserts.
    await pool.query('VACUUM ANALYZE outlive.tasks');
    const fillMs = performance.now() - fillStarted;

    const request = (owner: string) => ({ owner, limit: s.limit, maxTimeoutMs: 30_000, queues: null, names: ['noop'], leaseGraceMs: 5_000, leaseMs: 30_000, now: null });
    const client = await pool.connect();
    let plan = '';
    try {
      // The plan outlive.claim runs: CLAIM_SQL planned generically, with
      // sequential and bitmap scans priced out (the function's settings, migration 0010).
      await client.query('BEGIN');
      await client.query('SET LOCAL plan_cache_mode = force_generic_plan');
      await client.query('SET LOCAL enable_seqscan = off');
      await client.query('SET LOCAL enable_bitmapscan = off');
      await client.query(`PREPARE bench_claim AS ${CLAIM_SQL}`);
      const explained = await client.query(`EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(NULL, 30000, NULL, ${s.limit}, 'bench:explain', 5000, 30000, '{noop}')`);
      plan = explained.rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
      await client.query('ROLLBACK');
      await client.query('DEALLOCATE bench_claim');
    } finally {
      client.release();
    }
    const timesMs: number[] = [];
    for (let k = 0; k < s.reps; k++) {
      const started = performance.now();
      await claim(outlive.toExecutor(pool), request(`bench:${k}`));
      timesMs.push(performance.now() - started);
    }
    const ms = (label: string) => {
      const m = new RegExp(`${label} Time: ([0-9.]+) ms`).exec(plan);
      return m ? Number(m[1]) : null;
    };
    return { timesMs, plan, planningMs: ms('Planning'), executionMs: ms('Execution'), fillMs };
  } finally {
    await pool.end();
  }
}
