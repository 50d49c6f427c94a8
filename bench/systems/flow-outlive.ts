/**
 * outlive's side of the flow-control phases (lib/flow.ts, issue 26): the
 * tasks with limits and fairness, the workers that run them, and the claim
 * loop of the claim-cost phase. Runs in a system process (child.ts, the
 * `flow` op), imported from the working tree as systems/outlive.ts is.
 *
 * Two ways to run tasks:
 * - `worker`: createWorker (src/node/worker.ts) as an app runs it, LISTEN and
 *   a pass every 2 s when idle, with a pool of FLOW_POOL (the phases run up
 *   to 10 processes; createWorker's own pool of concurrency + 2 each would
 *   take more connections than the server has).
 * - `loop`: tick() back to back (50 ms apart when a pass finds nothing),
 *   with recovery at most once a second, as the worker does, for the options
 *   createWorker does not take: lease grace (the over-admission phase) and
 *   prefetch (the fairness phase's prefetch-0 run). With `listen`, a LISTEN
 *   connection wakes the pass (tick's `wakeups`) and the idle wait, as the
 *   worker's does.
 */
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type PgModule from 'pg';
import { z } from 'zod';
import * as core from '../../src/index.ts';
import * as node from '../../src/node/index.ts';
import { toExecutor } from '../../src/db/executor.ts';
import { claim } from '../../src/pass/claim.ts';
import { settle } from '../../src/pass/settle.ts';
import type { Outcome } from '../../src/pass/execute.ts';
import { epochMs } from './protocol.ts';

const outlive = { ...core, ...node };
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
// The repository's node-postgres, as in systems/outlive.ts (createWorker checks `pool instanceof pg.Pool`).
const pg = createRequire(`${ROOT}/package.json`)('pg') as typeof PgModule;
type Pool = PgModule.Pool;

/** Connections of a worker's pool in these phases (10 processes share max_connections 100). */
export const FLOW_POOL = 4;

const quiet: node.WorkerLogger = {
  info: () => undefined,
  warn: (m) => console.warn(m),
  error: (m) => console.error(m),
};

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

// --- the tasks ----------------------------------------------------------------

const fairInput = z.object({
  tenant: z.string(),
  i: z.number().int(),
  hold: z.number().nonnegative(),
  /** Epoch ms of the enqueue call (B's spaced tasks), for the start latency. */
  t: z.number().optional(),
  /** The concurrency key (variant `keys`). */
  key: z.string().optional(),
});
type FairInput = z.infer<typeof fairInput>;

/** The fairness phase's variants: fair turns alone, or A's tasks also spread over concurrency keys of 1. */
export type FairVariant = 'plain' | 'keys';

/** What a fairness worker saw: start times per tenant, and B's start latencies. */
interface FairLog {
  aStarts: number[];
  bStarts: number[];
  bLatencies: number[];
}

function fairTask(variant: FairVariant, log: FairLog | null) {
  const run = async (input: FairInput) => {
    const at = epochMs();
    if (log) {
      if (input.tenant === 'B') {
        log.bStarts.push(at);
        if (typeof input.t === 'number') log.bLatencies.push(at - input.t);
      } else log.aStarts.push(at);
    }
    if (input.hold > 0) await sleep(input.hold);
  };
  if (variant === 'keys') {
    return outlive.defineTask({
      name: 'fair',
      input: fairInput,
      fairness: { key: (i) => i.tenant },
      limits: [{ key: (i) => i.key ?? `tenant:${i.tenant}`, concurrency: 1 }],
      run,
    });
  }
  return outlive.defineTask({ name: 'fair', input: fairInput, fairness: { key: (i) => i.tenant }, run });
}

const admissionInput = z.object({ i: z.number().int() });

/**
 * The over-admission phase's tasks: `adm1` holds key k1 (concurrency 1),
 * `adm5` key k5 (concurrency 5). Each handler writes its start to
 * benchflow_events before it holds (0-50 ms at random) and its end after,
 * so a process killed mid-hold leaves a start without an end.
 */
function admissionTasks(events: Pool | null, proc: number, timeoutMs: number) {
  const make = (name: string, key: string, concurrency: number) =>
    outlive.defineTask({
      name,
      input: admissionInput,
      timeoutMs,
      retry: { maxAttempts: 10 },
      limits: [{ key, concurrency }],
      async run(_input, ctx) {
        if (!events) return;
        const started = epochMs();
        await events.query('INSERT INTO benchflow_events (id, attempt, key, proc, started) VALUES ($1, $2, $3, $4, $5)', [ctx.taskId, ctx.attempt, key, proc, started]);
        await sleep(Math.random() * 50);
        const ended = epochMs();
        await events.query('UPDATE benchflow_events SET ended = $1 WHERE id = $2 AND attempt = $3 AND proc = $4', [ended, ctx.taskId, ctx.attempt, proc]);
      },
    });
  return [make('adm1', 'k1', 1), make('adm5', 'k5', 5)];
}

/** Settings of the rate phase. */
export interface RateSettings {
  /** Starts per period of key `rpm`. */
  rpmLimit: number;
  /** Tokens per period of key `tpm`; each task's estimate is its cost. */
  tpmLimit: number;
  periodMs: number;
  /** Concurrency of key `provider`, whose one task throws the 429. */
  providerConcurrency: number;
  retryAfterMs: number;
}

const rateInput = z.object({ i: z.number().int(), est: z.number().positive().optional(), hold: z.number().nonnegative().optional(), throw429: z.boolean().optional() });

/** What a rate worker saw: each start as [key, epoch ms, cost], and when its handler threw the 429 (null if not here). */
interface RateLog {
  starts: [string, number, number][];
  thrownAt: number | null;
}

function rateTasks(s: RateSettings, log: RateLog | null, marks: Pool | null) {
  // `-spread` keys: the same rate with a burst of 1, each start spaced by its cost.
  const rated = (key: string, limit: number, tokens: boolean, burst?: number) =>
    outlive.defineTask({
      name: key,
      input: rateInput,
      limits: [{ key, rate: { limit, periodMs: s.periodMs, ...(burst === undefined ? {} : { burst }) }, ...(tokens ? { cost: (i: { est?: number }) => i.est ?? 1 } : {}) }],
      run: (input) => {
        log?.starts.push([key, epochMs(), tokens ? (input.est ?? 1) : 1]);
      },
    });
  const rpm = rated('rpm', s.rpmLimit, false);
  const tpm = rated('tpm', s.tpmLimit, true);
  const rpmSpread = rated('rpm-spread', s.rpmLimit, false, 1);
  const tpmSpread = rated('tpm-spread', s.tpmLimit, true, 1);
  const provider = outlive.defineTask({
    name: 'provider',
    input: rateInput,
    limits: [{ key: 'provider', concurrency: s.providerConcurrency }],
    async run(input) {
      log?.starts.push(['provider', epochMs(), 1]);
      if (input.throw429 && marks) {
        // Once across every process: the first to insert the mark throws.
        const first = await marks.query(`INSERT INTO benchflow_marks (name) VALUES ('429') ON CONFLICT DO NOTHING RETURNING name`);
        if (first.rows.length > 0) {
          if (log) log.thrownAt = epochMs();
          throw new outlive.RateLimitedError({ key: 'provider', retryAfterMs: s.retryAfterMs });
        }
      }
      if (input.hold) await sleep(input.hold);
    },
  });
  return { rpm, tpm, rpmSpread, tpmSpread, provider };
}

/** The claim-cost phase's task: key `k<n>` with concurrency `concurrency`. */
function costTask(concurrency: number) {
  return outlive.defineTask({
    name: 'cost',
    input: z.object({ i: z.number().int(), k: z.number().int() }),
    limits: [{ key: (i) => `k${i.k}`, concurrency }],
    run: () => undefined,
  });
}

// --- the process's state ----------------------------------------------------------

let url = '';
let pool: Pool | null = null;
let events: Pool | null = null;
let running: { stop(): Promise<void> } | null = null;
let fairLog: FairLog | null = null;
let rateLog: RateLog | null = null;

/** A running tick loop (see the top of this file). */
async function tickLoop(
  tasks: core.AnyTask[],
  o: { concurrency: number; prefetch?: number; leaseGraceMs?: number; owner: string; listen: boolean },
): Promise<{ stop(): Promise<void> }> {
  const workerPool = new pg.Pool({ connectionString: url, max: FLOW_POOL, application_name: 'benchflow-outlive-loop' });
  workerPool.on('error', (err) => console.warn(`outlive loop pool: ${err.message}`));
  const stop = new AbortController();
  const wakeups = new EventTarget();
  let wakeIdle: (() => void) | null = null;
  let listener: PgModule.Client | null = null;
  if (o.listen) {
    listener = new pg.Client({ connectionString: url, application_name: 'benchflow-outlive-listen' });
    listener.on('error', (err) => console.warn(`outlive loop listener: ${err.message}`));
    await listener.connect();
    listener.on('notification', () => {
      wakeups.dispatchEvent(new Event('wake'));
      wakeIdle?.();
    });
    await listener.query('LISTEN outlive');
  }
  let lastRecover = -Infinity;
  const done = (async () => {
    while (!stop.signal.aborted) {
      const recover = performance.now() - lastRecover >= 1_000;
      if (recover) lastRecover = performance.now();
      let report: core.TickReport | null = null;
      try {
        report = await outlive.tick(workerPool, {
          tasks,
          concurrency: o.concurrency,
          owner: o.owner,
          recover,
          signal: stop.signal,
          ...(o.prefetch === undefined ? {} : { prefetch: o.prefetch }),
          ...(o.leaseGraceMs === undefined ? {} : { leaseGraceMs: o.leaseGraceMs }),
          ...(o.listen ? { wakeups } : {}),
        });
      } catch (err) {
        console.warn(`outlive loop: pass failed: ${(err as Error).message}`);
      }
      if (stop.signal.aborted) break;
      if (report === null || report.stoppedBy === 'drained') {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 50);
          wakeIdle = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wakeIdle = null;
      }
    }
  })();
  return {
    async stop() {
      stop.abort();
      (wakeIdle as (() => void) | null)?.();
      await done;
      await listener?.end().catch(() => undefined);
      await workerPool.end();
    },
  };
}

/** createWorker with a pool of FLOW_POOL. */
async function startCreateWorker(tasks: core.AnyTask[], concurrency: number): Promise<{ stop(): Promise<void> }> {
  const workerPool = new pg.Pool({ connectionString: url, max: FLOW_POOL, application_name: 'benchflow-outlive-worker' });
  workerPool.on('error', (err) => console.warn(`outlive worker pool: ${err.message}`));
  const worker = outlive.createWorker({ pool: workerPool, tasks, concurrency, logger: quiet });
  await worker.start();
  return {
    async stop() {
      await worker.stop();
      await workerPool.end();
    },
  };
}

function must<T>(value: T | null, what: string): T {
  if (value === null) throw new Error(`flow-outlive: ${what} first`);
  return value;
}

async function enqueueChunked<T extends core.AnyTask>(task: T, inputs: core.TaskInput<T>[]): Promise<void> {
  for (let k = 0; k < inputs.length; k += 20_000) await outlive.enqueueMany(must(pool, 'open'), task, inputs.slice(k, k + 20_000));
}

const range = (n: number, from = 0) => Array.from({ length: n }, (_, k) => from + k);

/** The flow ops a system process answers (child.ts, op `flow`). */
export const flowOps: Record<string, (args: Record<string, unknown>) => Promise<unknown>> = {
  async version() {
    return JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')).version + ' (working tree)';
  },
  async open(args) {
    url = args.url as string;
    pool = new pg.Pool({ connectionString: url, max: 2, application_name: 'benchflow-outlive' });
    pool.on('error', (err) => console.warn(`outlive pool: ${err.message}`));
    await pool.query('SELECT 1');
    if (args.events) {
      events = new pg.Pool({ connectionString: url, max: 2, application_name: 'benchflow-outlive-events' });
      events.on('error', (err) => console.warn(`outlive events pool: ${err.message}`));
      await events.query('SELECT 1');
    }
  },
  async install(args) {
    await outlive.migrate(args.url as string);
  },

  // fairness
  /** Tenant A's backlog (`count` tasks), or tenant B's with `tenant: 'B'`. */
  async enqueueFair(args) {
    const variant = args.variant as FairVariant;
    const tenant = (args.tenant as string) ?? 'A';
    const keys = Number(args.keys ?? 0);
    const hold = Number(args.hold);
    const jitter = args.jitter === true;
    const inputs: FairInput[] = range(Number(args.count), Number(args.from ?? 0)).map((i) => ({
      tenant,
      i,
      hold: jitter ? Math.round(Math.random() * 2 * hold) : hold,
      ...(variant === 'keys' ? { key: tenant === 'A' ? `a:${i % Math.max(1, keys)}` : `tenant:${tenant}` } : {}),
    }));
    const started = performance.now();
    await enqueueChunked(fairTask(variant, null), inputs);
    return { ms: performance.now() - started };
  },
  async setWeight(args) {
    await outlive.setWeight(must(pool, 'open'), 'default', args.key as string, Number(args.weight));
  },
  /** Tenant B: one task every `spacingMs`, each stamped with the time of its enqueue call. */
  async enqueueSpacedB(args) {
    const task = fairTask(args.variant as FairVariant, null);
    const count = Number(args.count);
    const spacing = Number(args.spacingMs);
    const started = performance.now();
    // How long each enqueue call took: its commit is part of B's start latency.
    const enqueueMs: number[] = [];
    for (let k = 0; k < count; k++) {
      await sleep(started + k * spacing - performance.now());
      const called = performance.now();
      await outlive.enqueue(must(pool, 'open'), task, { tenant: 'B', i: k, hold: Number(args.hold), t: epochMs() });
      enqueueMs.push(performance.now() - called);
    }
    return { ms: performance.now() - started, enqueueMs };
  },
  async startFair(args) {
    fairLog = { aStarts: [], bStarts: [], bLatencies: [] };
    const task = fairTask(args.variant as FairVariant, fairLog);
    const concurrency = Number(args.concurrency);
    running =
      args.mode === 'loop'
        ? await tickLoop([task], { concurrency, prefetch: Number(args.prefetch ?? 1000), owner: 'fair', listen: true })
        : await startCreateWorker([task], concurrency);
  },

  // over-admission
  async enqueueAdmission(args) {
    const [adm1, adm5] = admissionTasks(null, 0, Number(args.timeoutMs));
    await enqueueChunked(adm1!, range(Number(args.k1)).map((i) => ({ i })));
    await enqueueChunked(adm5!, range(Number(args.k5)).map((i) => ({ i })));
  },
  async startAdmission(args) {
    const tasks = admissionTasks(must(events, 'open with events'), Number(args.proc), Number(args.timeoutMs));
    running = await tickLoop(tasks, {
      concurrency: Number(args.concurrency),
      leaseGraceMs: Number(args.leaseGraceMs),
      owner: `flow${Number(args.proc)}`,
      listen: false,
    });
  },
  /** Hands back every task whose lease expired (after the over-admission phase's last kill). */
  async recover() {
    return (await outlive.recover(must(pool, 'open'))).rows.length;
  },

  // rate
  async enqueueRate(args) {
    const s = args.settings as RateSettings;
    const { rpm, tpm, rpmSpread, tpmSpread, provider } = rateTasks(s, null, null);
    const [estMin, estMax] = args.est as [number, number];
    for (const t of [rpm, rpmSpread]) await enqueueChunked(t, range(Number(args.rpm)).map((i) => ({ i })));
    for (const t of [tpm, tpmSpread]) await enqueueChunked(t, range(Number(args.tpm)).map((i) => ({ i, est: Math.round(estMin + Math.random() * (estMax - estMin)) })));
    await enqueueChunked(provider, range(Number(args.provider)).map((i) => ({ i, hold: Number(args.hold) })));
  },
  /** The provider task that throws the 429, ahead of the others (priority 10). */
  async enqueue429(args) {
    const { provider } = rateTasks(args.settings as RateSettings, null, null);
    await outlive.enqueue(must(pool, 'open'), provider, { i: -1, hold: Number(args.hold), throw429: true }, { priority: 10 });
  },
  async startRate(args) {
    rateLog = { starts: [], thrownAt: null };
    const { rpm, tpm, rpmSpread, tpmSpread, provider } = rateTasks(args.settings as RateSettings, rateLog, must(pool, 'open'));
    running = await startCreateWorker([rpm, tpm, rpmSpread, tpmSpread, provider], Number(args.concurrency));
  },

  async stopWorker() {
    await running?.stop();
    running = null;
    const report = { fair: fairLog, rate: rateLog };
    fairLog = null;
    rateLog = null;
    return report;
  },

  // claim cost
  async enqueueCost(args) {
    const keys = Number(args.keys);
    await enqueueChunked(costTask(Number(args.concurrency)), range(Number(args.count)).map((i) => ({ i, k: i % keys })));
  },
  /**
   * Claims `measure` tasks, `limit` per claim, through outlive's claim (one
   * `outlive.claim_tasks` call, as a pass sends it), settling each batch as
   * succeeded before the next claim, on one connection; the Postgres CPU of
   * that connection's backend (/proc/<pid>/schedstat) is read around every
   * claim and every settle. `warmup` claims first, unmeasured.
   */
  async claimCost(args) {
    const limit = Number(args.limit);
    const measure = Number(args.measure);
    const own = new pg.Pool({ connectionString: url, max: 1, idleTimeoutMillis: 0, application_name: 'benchflow-outlive-claim' });
    try {
      const exec = toExecutor(own);
      const [{ pid }] = (await own.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows as [{ pid: number }];
      const cpu = () => {
        try {
          return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
        } catch {
          return NaN;
        }
      };
      const owner = `cost:${globalThis.crypto.randomUUID()}`;
      const cycle = async () => {
        const c0 = cpu();
        const w0 = performance.now();
        const rows = await claim(exec, {
          owner,
          limit,
          maxTimeoutMs: 60_000,
          queues: null,
          names: ['cost'],
          leaseGraceMs: 5_000,
          leaseMs: 30_000,
          now: null,
        });
        const w1 = performance.now();
        const c1 = cpu();
        const outcomes: Outcome[] = rows.map((r) => ({ id: r.id, runId: null, attempt: r.attempts, governed: true, state: 'succeeded', output: null }));
        const settled = await settle(own, owner, outcomes, null);
        const c2 = cpu();
        if (settled.length !== rows.length) throw new Error(`claimCost: settled ${settled.length} of ${rows.length}`);
        return { n: rows.length, claimCpu: c1 - c0, settleCpu: c2 - c1, claimMs: w1 - w0 };
      };
      for (let k = 0; k < Number(args.warmup ?? 3); k++) await cycle();
      const out = { claimed: 0, claims: 0, empty: 0, claimCpuMs: 0, settleCpuMs: 0, claimWallMs: 0, maxClaimCpuMs: 0 };
      while (out.claimed < measure) {
        const r = await cycle();
        out.claims++;
        if (r.n === 0 && ++out.empty > 20) throw new Error(`claimCost: ${out.empty} claims came back empty after ${out.claimed} tasks`);
        out.claimed += r.n;
        out.claimCpuMs += r.claimCpu;
        out.settleCpuMs += r.settleCpu;
        out.claimWallMs += r.claimMs;
        out.maxClaimCpuMs = Math.max(out.maxClaimCpuMs, r.claimCpu);
      }
      return out;
    } finally {
      await own.end();
    }
  },
  async setLimit(args) {
    await outlive.setLimit(must(pool, 'open'), args.key as string, { concurrency: Number(args.concurrency) });
  },

  async close() {
    await running?.stop();
    running = null;
    await events?.end();
    events = null;
    await pool?.end();
    pool = null;
  },
};
