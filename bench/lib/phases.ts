/**
 * The phases: each takes one system through one measurement on a fresh
 * database cloned from that system's migrated template, checks that every
 * job was enqueued or run exactly once, and returns what it measured.
 *
 * Every measured window is framed the same way:
 *   commits before  (nobody connected; read from the `postgres` database)
 *   open the system's processes, reset their counters
 *   start sampling the CPU of the database's backends
 *   ... the work ...
 *   stop sampling (backends still connected), read the processes' counters
 *   close the processes; commits after (nobody connected again)
 * The orchestrator's own statements on the database under test (completion
 * polls, checks) go through a Probe that counts them, and are taken out of
 * the commit count.
 */
import { BackendCpu } from './cpu.ts';
import { Child } from './children.ts';
import type { PhaseName, Sizes } from './config.ts';
import { Probe, urlFor, type Admin } from './postgres.ts';
import { quantile } from './stats.ts';
import { SQL } from './systems.ts';
import { epochMs, type Counters, type StatementStat, type SystemName, type WorkerReport } from '../systems/protocol.ts';

/** What one system did in one phase of one round. */
export interface PhaseResult {
  phase: PhaseName;
  system: SystemName;
  round: number;
  /** Set when the phase did not run, and why. */
  skipped?: string;
  /** Set when the phase failed (an error, a timeout, or a job that did not run exactly once). */
  error?: string;
  /** Named numbers; see METRICS in report.ts for units. */
  metrics: Record<string, number>;
  /** How exactly-once was checked, and what was found. */
  check?: string;
  /** Raw samples (latencies, claim times) in ms. */
  samples?: number[];
  /** Anything else worth printing (a query plan). */
  detail?: string;
  /** Statements the system's processes sent in the window, most frequent first. */
  statements?: StatementStat[];
  /** Lines printed under the phase's result (the liveness phase: the recovery promise, the server's other activity). */
  notes?: string[];
}

/** Merges the statement counts of several processes. */
function mergeStatements(counters: Counters[]): StatementStat[] {
  const byText = new Map<string, StatementStat>();
  for (const c of counters) {
    for (const s of c.statements) {
      const m = byText.get(s.text) ?? { text: s.text, n: 0, ms: 0 };
      m.n += s.n;
      m.ms += s.ms;
      byText.set(s.text, m);
    }
  }
  return [...byText.values()].sort((a, b) => b.n - a.n).slice(0, 12);
}

/** A system as its process describes itself. */
export interface SystemInfo {
  version: string;
  settings: string;
  node: string;
}

/** What a phase needs from the run. */
export interface Context {
  admin: Admin;
  sizes: Sizes;
  round: number;
  /** Processes still running, stopped by the runner if a phase throws. */
  live: Set<Child>;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** The name of the template database holding `system`'s migrated schema. */
export function templateOf(system: SystemName): string {
  return `${SQL[system].db}_tpl`;
}

async function freshDb(ctx: Context, system: SystemName): Promise<string> {
  const db = SQL[system].db;
  await ctx.admin.recreate(db, templateOf(system));
  return db;
}

async function spawn(ctx: Context, system: SystemName): Promise<Child> {
  const child = await Child.start(system);
  ctx.live.add(child);
  return child;
}

async function retire(ctx: Context, ...children: Child[]): Promise<void> {
  for (const child of children) {
    await child.call('close').catch(() => undefined);
    await child.stop();
    ctx.live.delete(child);
  }
}

/** Installs `system`'s schema into its template database (once per run). */
export async function prepareTemplate(ctx: Context, system: SystemName): Promise<SystemInfo> {
  const tpl = templateOf(system);
  await ctx.admin.recreate(tpl);
  const child = await spawn(ctx, system);
  const hello = await child.call<SystemInfo>('hello', { concurrency: ctx.sizes.concurrency });
  await child.call('install', { url: urlFor(tpl) });
  await retire(ctx, child);
  await ctx.admin.waitIdle(tpl);
  return hello;
}

async function committed(ctx: Context, db: string): Promise<number> {
  await ctx.admin.waitIdle(db);
  return ctx.admin.xactCommit(db);
}

/** The per-task costs of one window. */
function costs(tasks: number, counters: Counters[], commits: number, pgCpuMs: number | null): Record<string, number> {
  const queries = counters.reduce((s, c) => s + c.queries, 0);
  const clientCpuMs = counters.reduce((s, c) => s + c.cpuMs, 0);
  const m: Record<string, number> = {
    queriesPerTask: queries / tasks,
    commitsPerTask: commits / tasks,
    clientCpuMsPer1k: (clientCpuMs / tasks) * 1000,
  };
  if (pgCpuMs !== null) m.pgCpuMsPer1k = (pgCpuMs / tasks) * 1000;
  return m;
}

/** What one measured window returns. */
interface Window<T> {
  result: T;
  /** Each process's counters, read when the work was done (before shutdown). */
  counters: Counters[];
  /** What each process's worker reported as it stopped (empty reports for processes that ran none). */
  workerReports: WorkerReport[];
  /** Transactions committed in the database during the window, less the orchestrator's own. */
  commits: number;
  pgCpuMs: number | null;
  /** A fresh connection for checks after the window; close it. */
  probeAfter: Probe;
}

/** Opens `children` on `db`, frames the work as described at the top of this file, and returns the window's costs. */
async function window<T>(ctx: Context, db: string, children: Child[], work: (probe: Probe) => Promise<T>): Promise<Window<T>> {
  const before = await committed(ctx, db);
  for (const child of children) {
    await child.call('open', { url: urlFor(db) });
    await child.call('resetCounters');
  }
  const probe = await Probe.connect(db);
  const cpu = await BackendCpu.start(ctx.admin, db, [probe.pid]);
  let result: T;
  try {
    result = await work(probe);
  } catch (err) {
    await cpu.stop().catch(() => undefined);
    await probe.close().catch(() => undefined);
    throw err;
  }
  const pgCpuMs = await cpu.stop();
  const counters = await Promise.all(children.map((c) => c.call<Counters>('counters')));
  const workerReports = await Promise.all(children.map((c) => c.call<WorkerReport>('stopWorker')));
  await retire(ctx, ...children);
  await probe.close();
  const after = await committed(ctx, db);
  const probeAfter = await Probe.connect(db);
  return { result, counters, workerReports, commits: after - before - probe.statements, pgCpuMs, probeAfter };
}

/** Enqueue one job per call, `transaction` wrapping each in BEGIN ... COMMIT. */
export async function enqueueSingle(ctx: Context, system: SystemName, transaction: boolean): Promise<PhaseResult> {
  const phase: PhaseName = transaction ? 'enqueue-single-tx' : 'enqueue-single';
  const n = transaction ? ctx.sizes.enqueueSingleTx : ctx.sizes.enqueueSingle;
  const db = await freshDb(ctx, system);
  const child = await spawn(ctx, system);
  const w = await window(ctx, db, [child], () =>
    child.call<{ ms: number }>('enqueueSingle', { from: 0, count: n, transaction }),
  );
  const [row] = await w.probeAfter.rows<{ total: number; distinct: number }>(SQL[system].enqueued);
  await w.probeAfter.close();
  const ok = row!.total === n && row!.distinct === n;
  return {
    phase,
    system,
    round: ctx.round,
    metrics: { tasksPerSec: n / (w.result.ms / 1000), ms: w.result.ms, ...costs(n, w.counters, w.commits, w.pgCpuMs) },
    check: `${row!.total} rows, ${row!.distinct} distinct payloads, of ${n} enqueued`,
    statements: mergeStatements(w.counters),
    ...(ok ? {} : { error: `enqueued ${n}, found ${row!.total} rows with ${row!.distinct} distinct payloads` }),
  };
}

/** Adds up the per-job run counts of several worker processes and says whether each job ran exactly once. */
function exactlyOnce(n: number, reports: WorkerReport[]): { ok: boolean; text: string } {
  const total = new Uint16Array(n);
  let ran = 0;
  for (const r of reports) {
    ran += r.ran;
    const counts = Buffer.from(r.counts, 'base64');
    for (let i = 0; i < n && i < counts.length; i++) total[i]! += counts[i]!;
  }
  let missing = 0;
  let repeated = 0;
  for (let i = 0; i < n; i++) {
    if (total[i] === 0) missing++;
    else if (total[i]! > 1) repeated++;
  }
  return {
    ok: missing === 0 && repeated === 0 && ran === n,
    text: `handlers ran ${ran} times for ${n} jobs: ${missing} never ran, ${repeated} ran more than once`,
  };
}

/**
 * Starts a worker in each of `children` (at `goAt`), waits until their
 * handlers have run `n` times and no job is left unfinished in the database,
 * and returns the moment the database was seen drained.
 */
async function runToEmpty(
  ctx: Context,
  system: SystemName,
  children: Child[],
  probe: Probe,
  n: number,
  timeoutMs: number,
  beforeWait: (goAt: number) => Promise<void> = async () => undefined,
  concurrency = ctx.sizes.concurrency,
): Promise<{ goAt: number; doneAt: number }> {
  const deadline = performance.now() + timeoutMs;
  const ranSoFar = () => children.reduce((s, c) => s + c.ran, 0);
  const ranAll = new Promise<void>((resolve) => {
    const check = () => {
      if (ranSoFar() >= n) resolve();
    };
    for (const c of children) c.onProgress = check;
  });
  const goAt = epochMs();
  await Promise.all(children.map((c) => c.call('startWorker', { concurrency, size: n })));
  await beforeWait(goAt);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`only ${ranSoFar()} of ${n} jobs ran within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    await Promise.race([ranAll, timedOut]);
  } finally {
    clearTimeout(timer);
  }
  // The handlers have all run; the drain ends when the last completion has
  // committed. Polled every 5 ms: the error is at most that, on runs of seconds.
  for (;;) {
    const at = epochMs();
    const [row] = await probe.rows<{ n: number }>(SQL[system].remaining);
    if (row!.n === 0) return { goAt, doneAt: at };
    if (performance.now() > deadline) throw new Error(`${row!.n} jobs still unfinished after ${timeoutMs} ms`);
    await sleep(5);
  }
}

async function checkFinished(system: SystemName, n: number, w: Window<unknown>): Promise<{ ok: boolean; text: string }> {
  const [fin] = await w.probeAfter.rows<{ done: number | null; repeated: number; left: number }>(SQL[system].finished);
  await w.probeAfter.close();
  const once = exactlyOnce(n, w.workerReports);
  const dbOk = fin!.left === 0 && fin!.repeated === 0 && (fin!.done === null || fin!.done === n);
  return {
    ok: once.ok && dbOk,
    text: `${once.text}; database: ${fin!.done ?? 'n/a (deleted on completion)'} completed, ${fin!.left} left, ${fin!.repeated} retried`,
  };
}

/**
 * Bulk-enqueues `sizes.drain` jobs in one call (the enqueue-bulk phase, when
 * `measureBulk`), then drains them with `processes` worker processes (the
 * drain-1 or drain-2 phase).
 */
export async function bulkAndDrain(ctx: Context, system: SystemName, processes: 1 | 2, measureBulk: boolean): Promise<PhaseResult[]> {
  const n = ctx.sizes.drain;
  const results: PhaseResult[] = [];
  const db = await freshDb(ctx, system);

  const enqueuer = await spawn(ctx, system);
  const bulk = await window(ctx, db, [enqueuer], () =>
    enqueuer.call<{ ms: number }>('enqueueBulk', { from: 0, count: n, chunk: ctx.sizes.bulkChunk }),
  );
  const [row] = await bulk.probeAfter.rows<{ total: number; distinct: number }>(SQL[system].enqueued);
  // The server runs with autovacuum off: give every system's planner the
  // statistics autovacuum would have gathered after so many inserts.
  await bulk.probeAfter.rows('ANALYZE');
  await bulk.probeAfter.close();
  const enqueuedOk = row!.total === n && row!.distinct === n;
  const enqueuedText = `${row!.total} rows, ${row!.distinct} distinct payloads, of ${n} enqueued`;
  if (measureBulk) {
    results.push({
      phase: 'enqueue-bulk',
      system,
      round: ctx.round,
      metrics: { tasksPerSec: n / (bulk.result.ms / 1000), ms: bulk.result.ms, ...costs(n, bulk.counters, bulk.commits, bulk.pgCpuMs) },
      check: enqueuedText,
      statements: mergeStatements(bulk.counters),
      ...(enqueuedOk ? {} : { error: `bulk enqueue: ${enqueuedText}` }),
    });
  }
  if (!enqueuedOk) throw new Error(`bulk enqueue before the drain: ${enqueuedText}`);

  const workers: Child[] = [];
  for (let k = 0; k < processes; k++) workers.push(await spawn(ctx, system));
  const drain = await window(ctx, db, workers, (probe) => runToEmpty(ctx, system, workers, probe, n, Math.max(60_000, n * 2)));
  const check = await checkFinished(system, n, drain);
  const firstRunAt = Math.min(...drain.workerReports.map((r) => r.firstRunAt ?? Infinity));
  const ms = drain.result.doneAt - firstRunAt;
  results.push({
    phase: processes === 1 ? 'drain-1' : 'drain-2',
    system,
    round: ctx.round,
    metrics: {
      tasksPerSec: n / (ms / 1000),
      ms,
      startupMs: firstRunAt - drain.result.goAt,
      ...costs(n, drain.counters, drain.commits, drain.pgCpuMs),
    },
    check: check.text,
    statements: mergeStatements(drain.counters),
    ...(check.ok ? {} : { error: `not exactly once: ${check.text}` }),
  });
  return results;
}

/**
 * Enqueue-to-start latency: a worker process sits idle, and another process
 * enqueues `latencyCount` jobs one at a time, `latencySpacingMs` apart, each
 * carrying the time just before its enqueue call. The handler records how
 * long after that it started.
 */
export async function latency(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const n = ctx.sizes.latencyCount;
  const db = await freshDb(ctx, system);
  const worker = await spawn(ctx, system);
  const enqueuer = await spawn(ctx, system);
  const w = await window(ctx, db, [worker, enqueuer], (probe) =>
    runToEmpty(ctx, system, [worker], probe, n, 60_000, async () => {
      await sleep(ctx.sizes.latencyIdleMs);
      await enqueuer.call('enqueueSpaced', { from: 0, count: n, spacingMs: ctx.sizes.latencySpacingMs });
    }),
  );
  const check = await checkFinished(system, n, w);
  const samples = w.workerReports.flatMap((r) => r.latencies);
  return {
    phase: 'latency',
    system,
    round: ctx.round,
    metrics: {
      p50: quantile(samples, 0.5),
      p95: quantile(samples, 0.95),
      p99: quantile(samples, 0.99),
      max: Math.max(...samples),
      mean: samples.reduce((s, x) => s + x, 0) / samples.length,
      ...costs(n, w.counters, w.commits, w.pgCpuMs),
    },
    samples,
    check: check.text,
    statements: mergeStatements(w.counters),
    ...(check.ok ? {} : { error: `not exactly once: ${check.text}` }),
  };
}

interface ClaimTimeResult {
  timesMs: number[];
  plan: string;
  planningMs: number | null;
  executionMs: number | null;
  fillMs: number;
}

/**
 * outlive only: the time of one claim as a worker sends it (a call of
 * outlive.claim, whose body is CLAIM_SQL of src/pass/claim.ts; 10 tasks) with
 * 1,000,000 finished rows in the table, and with 100,000 pending ones.
 */
export async function claim(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const s = ctx.sizes;
  const metrics: Record<string, number> = {};
  const details: string[] = [];
  const samples: number[] = [];
  const scenarios = [
    { key: 'finished', finished: s.claimFinished, pending: s.claimPendingBesideFinished },
    { key: 'pending', finished: 0, pending: s.claimPending },
  ];
  const child = await spawn(ctx, system);
  for (const sc of scenarios) {
    const db = await freshDb(ctx, system);
    const r = await child.call<ClaimTimeResult>('claimTime', {
      url: urlFor(db),
      finished: sc.finished,
      pending: sc.pending,
      reps: s.claimReps,
      limit: s.claimLimit,
    });
    metrics[`${sc.key}P50`] = quantile(r.timesMs, 0.5);
    metrics[`${sc.key}P95`] = quantile(r.timesMs, 0.95);
    if (r.executionMs !== null) metrics[`${sc.key}ExecMs`] = r.executionMs;
    if (r.planningMs !== null) metrics[`${sc.key}PlanMs`] = r.planningMs;
    if (sc.key === 'finished') samples.push(...r.timesMs);
    details.push(`-- ${sc.finished} finished, ${sc.pending} pending rows (filled in ${Math.round(r.fillMs)} ms)\n${r.plan}`);
  }
  await retire(ctx, child);
  return {
    phase: 'claim',
    system,
    round: ctx.round,
    metrics,
    samples,
    detail: details.join('\n\n'),
    check: `${s.claimReps} claims of ${s.claimLimit} per table, each committed`,
  };
}

/**
 * outlive only: a run of one root, `dagLeaves` tasks after it and one join
 * after all of them, drained by one worker process (concurrency 10). The
 * graph is written up front by startRun (`dag`), or spawned by the root's
 * handler (`dag-spawn`). Measures the startRun call, then the run from its
 * first task's start to its last task's commit.
 */
export async function dag(ctx: Context, system: SystemName, spawned: boolean): Promise<PhaseResult> {
  const leaves = ctx.sizes.dagLeaves;
  const n = leaves + 2;
  const db = await freshDb(ctx, system);
  const child = await spawn(ctx, system);
  const timeoutMs = Math.max(60_000, n * 20);
  const w = await window(ctx, db, [child], async (probe) => {
    const started = await child.call<{ ms: number; runId: string }>('startDagRun', { url: urlFor(db), leaves, spawned });
    const r = await runToEmpty(ctx, system, [child], probe, n, timeoutMs);
    // The run's own row is settled with its last task; wait for it to say so.
    const deadline = performance.now() + 10_000;
    let state = '';
    while (performance.now() < deadline) {
      const [row] = await probe.rows<{ state: string }>(`SELECT state::text FROM outlive.runs WHERE id = $1`, [started.runId]);
      state = row?.state ?? 'missing';
      if (state !== 'running') break;
      await sleep(5);
    }
    return { ...r, startMs: started.ms, runState: state };
  });
  const check = await checkFinished(system, n, w);
  const ok = check.ok && w.result.runState === 'succeeded';
  const firstRunAt = Math.min(...w.workerReports.map((r) => r.firstRunAt ?? Infinity));
  const ms = w.result.doneAt - firstRunAt;
  return {
    phase: spawned ? 'dag-spawn' : 'dag',
    system,
    round: ctx.round,
    metrics: { startRunMs: w.result.startMs, tasksPerSec: n / (ms / 1000), ms, ...costs(n, w.counters, w.commits, w.pgCpuMs) },
    check: `${check.text}; run ${w.result.runState}`,
    statements: mergeStatements(w.counters),
    ...(ok ? {} : { error: `DAG run: ${check.text}; run ${w.result.runState}` }),
  };
}

/**
 * outlive only: `serverlessTasks` jobs, bulk-enqueued beforehand, drained by
 * signed POST /drain requests to the Cloudflare Worker (functions/) running
 * in Miniflare, each request one bounded pass through the Neon driver.
 * Round trips cannot be counted inside workerd; the WebSocket messages the
 * driver sent through the proxy stand in for them.
 */
export async function serverless(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const n = ctx.sizes.serverlessTasks;
  const db = await freshDb(ctx, system);
  const enqueuer = await spawn(ctx, system);
  await enqueuer.call('open', { url: urlFor(db) });
  await enqueuer.call('enqueueBulk', { from: 0, count: n, chunk: n });
  await retire(ctx, enqueuer);
  const analyze = await Probe.connect(db);
  await analyze.rows('ANALYZE');
  await analyze.close();

  const child = await spawn(ctx, system);
  const w = await window(ctx, db, [child], () =>
    child.call<{ ms: number; startMs: number; passes: number; claimed: number; messages: number; connections: number; ran: number[] }>(
      'serverlessDrain',
      { url: urlFor(db), concurrency: ctx.sizes.concurrency, budgetMs: 20_000, maxPasses: 10_000 },
      600_000,
    ),
  );
  const counts = new Uint8Array(n);
  for (const i of w.result.ran) if (i < n && counts[i]! < 255) counts[i]!++;
  w.workerReports = [{ ran: w.result.ran.length, counts: Buffer.from(counts).toString('base64'), firstRunAt: null, lastRunAt: null, latencies: [] }];
  const check = await checkFinished(system, n, w);
  const m = costs(n, w.counters, w.commits, w.pgCpuMs);
  return {
    phase: 'serverless',
    system,
    round: ctx.round,
    metrics: {
      tasksPerSec: n / (w.result.ms / 1000),
      ms: w.result.ms,
      startMs: w.result.startMs,
      passes: w.result.passes,
      messagesPerTask: w.result.messages / n,
      connections: w.result.connections,
      commitsPerTask: m.commitsPerTask!,
      ...(m.pgCpuMsPer1k === undefined ? {} : { pgCpuMsPer1k: m.pgCpuMsPer1k }),
    },
    check: `${check.text} (from the Worker's output)`,
    ...(check.ok ? {} : { error: `not exactly once: ${check.text}` }),
  };
}


/**
 * What each system promises about the jobs of a worker that dies mid-job,
 * printed with the liveness phase: the other half of what its writes while
 * waiting buy. pg-boss's jobs in that phase are sent with a per-job heartbeat
 * (systems/pgboss.ts) so that its promise is comparable with outlive's.
 */
export const RECOVERY: Partial<Record<SystemName, string>> = {
  outlive: "a dead pass's tasks are recovered within one lease (35 s)",
  'graphile-worker': "a crashed worker's jobs wait 4 hours (locked_at timeout)",
  'pg-boss':
    'jobs sent with heartbeatSeconds: 30 (pg-boss 12 per-job heartbeat; the worker refreshes heartbeat_on every 15 s, heartbeatSeconds / 2): ' +
    "the supervisor (every 60 s) fails and retries a job whose heartbeat is over 30 s old, so a dead worker's jobs are recovered within 30-90 s; " +
    'without a heartbeat only expireInSeconds (default 900 s) bounds an active job',
};

/**
 * How long after all the liveness jobs are running the window opens. A
 * backend adds its table counters to the shared statistics when it goes idle,
 * at most once a second (PGSTAT_MIN_INTERVAL; PostgreSQL 15): a backend that
 * goes idle less than a second after its last flush keeps its counts until
 * its next statement a second or more later, or until it has been idle for
 * PGSTAT_IDLE_INTERVAL (10 s). `pg_stat_force_next_flush()` does not help: it
 * flushes only the calling backend's own counters, and the writes being
 * counted are the system's backends'. So the window opens 1.5 s after the
 * last job started, when the start-up writes (claims, fetches, locks) have
 * normally been flushed; both readings of the window then lag alike, which
 * in a steady state cancels. Because a count can still arrive up to 10 s
 * late, the same spans are also counted exactly from the WAL records
 * themselves (pg_walinspect, when the server has it; see WalTally), which
 * do not lag and belong to this database alone.
 */
const STATS_SETTLE_MS = 1_500;
/** The last reading is taken this long before the first job could finish (it started after goAt and sleeps sleepMs). */
const WAIT_END_MARGIN_MS = 500;

/** The counters one liveness reading takes. */
export interface StatReading {
  /** Epoch ms when the reading started. */
  at: number;
  lsn: bigint;
  ins: number;
  upd: number;
  del: number;
  hot: number;
  /** Jobs the system's own table shows held by a worker. */
  running: number;
  checkpoints: number;
  /** Every other database: transactions committed, rows written. */
  others: Map<string, { commits: number; writes: number }>;
  /** Connections to the database under test. */
  backends: number;
}

function parseLsn(lsn: string): bigint {
  const [hi, lo] = lsn.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

export async function readStats(ctx: Context, db: string, probe: Probe, system: SystemName): Promise<StatReading> {
  const at = epochMs();
  // WAL position and the table counters back to back; the WAL position is
  // exact, the counters lag by up to a flush (see STATS_SETTLE_MS).
  const [wal] = await ctx.admin.rows<{ lsn: string }>(`SELECT pg_current_wal_lsn()::text AS lsn`);
  const [t] = await probe.rows<{ ins: string; upd: string; del: string; hot: string }>(
    `SELECT coalesce(sum(n_tup_ins), 0)::text AS ins, coalesce(sum(n_tup_upd), 0)::text AS upd,
            coalesce(sum(n_tup_del), 0)::text AS del, coalesce(sum(n_tup_hot_upd), 0)::text AS hot
     FROM pg_stat_user_tables WHERE schemaname = $1`,
    [SQL[system].schema],
  );
  const [r] = await probe.rows<{ n: number }>(SQL[system].running);
  let checkpoints: number;
  try {
    const [c] = await ctx.admin.rows<{ n: string }>(`SELECT (checkpoints_timed + checkpoints_req)::text AS n FROM pg_stat_bgwriter`);
    checkpoints = Number(c!.n);
  } catch {
    // PostgreSQL 17 moved them to pg_stat_checkpointer.
    const [c] = await ctx.admin.rows<{ n: string }>(`SELECT (num_timed + num_requested)::text AS n FROM pg_stat_checkpointer`);
    checkpoints = Number(c!.n);
  }
  const others = new Map<string, { commits: number; writes: number }>();
  for (const d of await ctx.admin.rows<{ datname: string; commits: string; writes: string }>(
    `SELECT datname, xact_commit::text AS commits, (tup_inserted + tup_updated + tup_deleted)::text AS writes
     FROM pg_stat_database WHERE datname IS NOT NULL AND datname <> $1`,
    [db],
  )) {
    others.set(d.datname, { commits: Number(d.commits), writes: Number(d.writes) });
  }
  const backends = (await ctx.admin.backends(db, [probe.pid])).length;
  return {
    at,
    lsn: parseLsn(wal!.lsn),
    ins: Number(t!.ins),
    upd: Number(t!.upd),
    del: Number(t!.del),
    hot: Number(t!.hot),
    running: r!.n,
    checkpoints,
    others,
    backends,
  };
}

/** What happened between two readings. */
export interface StatSpan {
  seconds: number;
  ins: number;
  upd: number;
  del: number;
  hot: number;
  walBytes: number;
  checkpoints: number;
  /** Rows written in other databases (any, the `postgres` database included). */
  otherWrites: number;
  /** Transactions committed in other databases, less `postgres` (where the harness's own reads commit). */
  otherCommits: number;
  /** Other databases that wrote or committed, created or dropped in the span. */
  busy: string[];
}

export function span(a: StatReading, b: StatReading): StatSpan {
  let otherWrites = 0;
  let otherCommits = 0;
  const busy: string[] = [];
  for (const [name, after] of b.others) {
    const before = a.others.get(name);
    if (!before) {
      busy.push(`${name} (created)`);
      continue;
    }
    const writes = after.writes - before.writes;
    const commits = name === 'postgres' ? 0 : after.commits - before.commits;
    otherWrites += writes;
    otherCommits += commits;
    if (writes > 0 || commits > 0) busy.push(`${name} (${commits} commits, ${writes} rows)`);
  }
  for (const name of a.others.keys()) if (!b.others.has(name)) busy.push(`${name} (dropped)`);
  return {
    seconds: (b.at - a.at) / 1000,
    ins: b.ins - a.ins,
    upd: b.upd - a.upd,
    del: b.del - a.del,
    hot: b.hot - a.hot,
    walBytes: Number(b.lsn - a.lsn),
    checkpoints: b.checkpoints - a.checkpoints,
    otherWrites,
    otherCommits,
    busy,
  };
}

export const writesOf = (s: { ins: number; upd: number; del: number }) => s.ins + s.upd + s.del;

/** The heap and WAL records of the database under test between two WAL positions, counted from the records. */
export interface WalCount {
  ins: number;
  upd: number;
  hot: number;
  del: number;
  /** Bytes of the records that touch this database's relations, and of the commit records of their transactions (full-page images included). */
  dbBytes: number;
  /** Of which full-page images. */
  fpiBytes: number;
  /** Bytes of every record in the range, whichever database. */
  allBytes: number;
}

/**
 * Counts, from the WAL records themselves (pg_walinspect, PostgreSQL 15+),
 * the rows written to the tables of `schema` in the probe's database (heap
 * INSERT, UPDATE, HOT_UPDATE, DELETE; MULTI_INSERT by its tuples) and the WAL
 * this database wrote: exact, where the statistics lag, and this database's
 * alone, where the WAL position is the server's. Read after the wait (so
 * the reading costs the measurement nothing), from WAL that the probe's
 * temporary replication slot keeps on disk (holdWal): on a shared server
 * checkpoints come every second or two (each CREATE DATABASE forces one)
 * and remove the segments behind them. A step (`advance`) takes the records
 * that end by its end and starts the next where the last one ended, so none
 * is counted twice or lost. Any failure (the extension missing, a segment
 * gone) leaves the tally `broken`, and its counts unused.
 */
export class WalTally {
  private cursor: bigint;
  private readonly count: WalCount = { ins: 0, upd: 0, hot: 0, del: 0, dbBytes: 0, fpiBytes: 0, allBytes: 0 };
  broken: string | null = null;

  constructor(
    private readonly probe: Probe,
    private readonly schema: string,
    from: bigint,
  ) {
    this.cursor = from;
  }

  /** The counts so far. */
  snapshot(): WalCount {
    return { ...this.count };
  }

  /** Reads the records from where the last step stopped up to `to` (default, or if not yet flushed after 2 s: as far as the WAL has been flushed). */
  async advance(to: bigint | null = null): Promise<void> {
    if (this.broken) return;
    try {
      // Only flushed WAL can be read: wait (briefly) for the WAL writer to reach `to`.
      let flushed = 0n;
      for (let k = 0; k < 100; k++) {
        const [f] = await this.probe.rows<{ lsn: string }>(`SELECT pg_current_wal_flush_lsn()::text AS lsn`);
        flushed = parseLsn(f!.lsn);
        if (to === null || flushed >= to) break;
        await sleep(20);
      }
      const end = to === null || to > flushed ? flushed : to;
      if (end <= this.cursor) return;
      const [r] = await this.probe.rows<Record<keyof WalCount | 'last', string | null>>(
        `WITH rels AS (
           SELECT c.relfilenode::text AS fn FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = $3 AND c.relkind IN ('r', 't', 'm') AND c.relfilenode <> 0
         ), recs AS (
           SELECT r.end_lsn, r.resource_manager AS rm, r.record_type AS rt, r.record_length AS len, r.fpi_length AS fpi, r.xid, r.description AS d,
                  substring(r.block_ref from 'rel [0-9]+/([0-9]+)/') AS dboid,
                  substring(r.block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') AS fn
           FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) r
         ), ours AS (
           SELECT * FROM recs WHERE dboid = (SELECT oid::text FROM pg_database WHERE datname = current_database())
         ), heap AS (
           SELECT * FROM ours WHERE fn IN (SELECT fn FROM rels)
         )
         SELECT (SELECT count(*) FROM heap WHERE rm = 'Heap' AND rt LIKE 'INSERT%')
                  + (SELECT coalesce(sum(substring(d from 'ntuples:? ([0-9]+)')::int), 0) FROM heap WHERE rm = 'Heap2' AND rt LIKE 'MULTI_INSERT%') AS ins,
                (SELECT count(*) FROM heap WHERE rm = 'Heap' AND (rt LIKE 'UPDATE%' OR rt LIKE 'HOT_UPDATE%')) AS upd,
                (SELECT count(*) FROM heap WHERE rm = 'Heap' AND rt LIKE 'HOT_UPDATE%') AS hot,
                (SELECT count(*) FROM heap WHERE rm = 'Heap' AND rt = 'DELETE') AS del,
                -- The commit records of this database's transactions carry no block: matched by xid (within the step).
                (SELECT coalesce(sum(len), 0) FROM ours)
                  + (SELECT coalesce(sum(len), 0) FROM recs WHERE rm = 'Transaction' AND dboid IS NULL
                       AND xid IN (SELECT xid FROM ours WHERE xid <> 0)) AS "dbBytes",
                (SELECT coalesce(sum(fpi), 0) FROM ours) AS "fpiBytes",
                (SELECT coalesce(sum(len), 0) FROM recs) AS "allBytes",
                (SELECT max(end_lsn)::text FROM recs) AS last`,
        [formatLsn(this.cursor), formatLsn(end), this.schema],
      );
      if (r!.last === null) return;
      this.count.ins += Number(r!.ins);
      this.count.upd += Number(r!.upd);
      this.count.hot += Number(r!.hot);
      this.count.del += Number(r!.del);
      this.count.dbBytes += Number(r!.dbBytes);
      this.count.fpiBytes += Number(r!.fpiBytes);
      this.count.allBytes += Number(r!.allBytes);
      this.cursor = parseLsn(r!.last);
    } catch (err) {
      this.broken = (err as Error).message;
      console.warn(`bench: liveness: WAL records not counted: ${this.broken}`);
    }
  }

}

/**
 * Keeps the server's WAL from here on on disk while `probe` is connected: a
 * temporary physical replication slot reserving WAL at once, dropped by the
 * server when the probe's session ends (window() closes it right after the
 * phase's work). Answers false, and WalTally is not used, if the server
 * refuses (no free slot, wal_level minimal).
 */
export async function holdWal(probe: Probe): Promise<boolean> {
  try {
    await probe.rows(`SELECT pg_create_physical_replication_slot($1, true, true)`, [`bench_liveness_${process.pid}_${probe.pid}`]);
    return true;
  } catch (err) {
    console.warn(`bench: liveness: WAL records not counted: no replication slot to keep them (${(err as Error).message})`);
    return false;
  }
}

export function quietText(s: StatSpan): string {
  const quiet = s.otherWrites === 0 && s.otherCommits === 0 && s.busy.length === 0 && s.checkpoints === 0;
  if (quiet) return 'server quiet: no other database committed or wrote a row, no checkpoint';
  const parts = [...s.busy];
  if (s.checkpoints > 0) parts.push(`${s.checkpoints} checkpoint(s) (full-page images follow)`);
  return `server NOT quiet, the WAL figure includes: ${parts.join('; ')}`;
}

function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}

/**
 * Liveness: `livenessTasks` jobs whose handlers each wait `livenessSleepMs`
 * (mostly waiting, as a model call does), run by one process with that many
 * at once. Once the system's own table shows them all held by the worker and
 * every handler has started, and the start-up writes have reached the
 * statistics (STATS_SETTLE_MS), the phase reads, before and after a window of
 * `livenessWindowMs`: the row writes (n_tup_ins + n_tup_upd + n_tup_del, and
 * n_tup_hot_upd) of the system's schema in pg_stat_user_tables, and the
 * server's WAL position. A third reading just before the first job could
 * finish gives the same over the whole wait (a 10-s window can miss a
 * heartbeat that comes every 15 s, as pg-boss's does at heartbeatSeconds 30).
 * WAL is server-wide: the phase reports what other databases did meanwhile.
 * Then the jobs finish and are checked as the drains' are.
 */
export async function liveness(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const { livenessTasks: n, livenessSleepMs: sleepMs, livenessWindowMs: windowMs } = ctx.sizes;
  const db = await freshDb(ctx, system);
  const enqueuer = await spawn(ctx, system);
  await enqueuer.call('open', { url: urlFor(db) });
  await enqueuer.call('enqueueBulk', { from: 0, count: n, chunk: n, sleepMs });
  await retire(ctx, enqueuer);
  const analyze = await Probe.connect(db);
  await analyze.rows('ANALYZE');
  // For counting the WAL records of the wait (WalTally); a superuser's
  // statement, in this database only (it is dropped after the phase).
  const inspectable = await analyze
    .rows('CREATE EXTENSION IF NOT EXISTS pg_walinspect')
    .then(() => true)
    .catch((err: Error) => {
      console.warn(`bench: liveness: no pg_walinspect (${err.message}); only the statistics are read`);
      return false;
    });
  await analyze.close();

  const worker = await spawn(ctx, system);
  type Measured = { startupMs: number; window: StatSpan; wait: StatSpan; backends: number; walWindow: WalCount | null; walWait: WalCount | null };
  let measured: Measured | null = null;
  const w = await window(ctx, db, [worker], (probe) =>
    runToEmpty(
      ctx,
      system,
      [worker],
      probe,
      n,
      sleepMs + 120_000,
      async (goAt) => {
        // No job can finish before this: each started after goAt and waits sleepMs.
        const lastSafe = goAt + sleepMs - WAIT_END_MARGIN_MS;
        let running = 0;
        for (;;) {
          if (worker.ran >= n) {
            const [row] = await probe.rows<{ n: number }>(SQL[system].running);
            running = row!.n;
            if (running >= n) break;
          }
          if (epochMs() > lastSafe) {
            throw new Error(`liveness: only ${worker.ran} handlers started and ${running} jobs held of ${n} before the first could finish`);
          }
          await sleep(20);
        }
        const allRunningAt = epochMs();
        if (allRunningAt + STATS_SETTLE_MS + windowMs > lastSafe) {
          throw new Error(
            `liveness: all ${n} running ${Math.round(allRunningAt - goAt)} ms after the start: a window of ${windowMs} ms ` +
              `${STATS_SETTLE_MS} ms later would not end before the first could finish (${sleepMs} ms)`,
          );
        }
        await sleep(allRunningAt + STATS_SETTLE_MS - epochMs());
        const held = inspectable && (await holdWal(probe));
        const a = await readStats(ctx, db, probe, system);
        await sleep(a.at + windowMs - epochMs());
        const b = await readStats(ctx, db, probe, system);
        await sleep(lastSafe - epochMs());
        const c = await readStats(ctx, db, probe, system);
        const tally = held ? new WalTally(probe, SQL[system].schema, a.lsn) : null;
        await tally?.advance(b.lsn);
        const walWindow = tally && !tally.broken ? tally.snapshot() : null;
        await tally?.advance(c.lsn);
        const walWait = tally && !tally.broken ? tally.snapshot() : null;
        for (const [label, r] of [['window start', a], ['window end', b], ['end of the wait', c]] as const) {
          if (r.running !== n) throw new Error(`liveness: ${r.running} of ${n} jobs held at the ${label}: the readings were not all inside the wait`);
        }
        measured = {
          startupMs: allRunningAt - goAt,
          window: span(a, b),
          wait: span(a, c),
          backends: Math.max(a.backends, b.backends, c.backends),
          walWindow,
          walWait,
        };
      },
      n,
    ),
  );
  const check = await checkFinished(system, n, w);
  const m = measured as Measured | null;
  if (!m) throw new Error('liveness: the wait was not measured');
  const win = m.window;
  const wait = m.wait;
  const rate = (x: number, s: StatSpan) => x / s.seconds;
  const describe = (label: string, s: StatSpan) =>
    `${label} (${s.seconds.toFixed(1)} s): ${s.ins} inserted, ${s.upd} updated (${s.hot} HOT), ${s.del} deleted rows in schema ${SQL[system].schema}; ` +
    `${Math.round(s.walBytes / 1024).toLocaleString('en-US')} kB of WAL`;
  return {
    phase: 'liveness',
    system,
    round: ctx.round,
    metrics: {
      writesPerSec: rate(writesOf(win), win),
      hotWritesPerSec: rate(win.hot, win),
      walKBPerSec: rate(win.walBytes, win) / 1024,
      windowSec: win.seconds,
      waitWritesPerSec: rate(writesOf(wait), wait),
      waitHotWritesPerSec: rate(wait.hot, wait),
      waitWalKBPerSec: rate(wait.walBytes, wait) / 1024,
      waitSec: wait.seconds,
      startupMs: m.startupMs,
      connections: m.backends,
      otherWrites: wait.otherWrites,
      otherCommits: wait.otherCommits,
      checkpoints: wait.checkpoints,
      ...(m.walWindow
        ? {
            walRowWritesPerSec: rate(writesOf(m.walWindow), win),
            walHotPerSec: rate(m.walWindow.hot, win),
            dbWalKBPerSec: rate(m.walWindow.dbBytes, win) / 1024,
          }
        : {}),
      ...(m.walWait
        ? {
            waitWalRowWritesPerSec: rate(writesOf(m.walWait), wait),
            waitWalHotPerSec: rate(m.walWait.hot, wait),
            waitDbWalKBPerSec: rate(m.walWait.dbBytes, wait) / 1024,
          }
        : {}),
      ...costs(n, w.counters, w.commits, w.pgCpuMs),
    },
    check: `${check.text}; all ${n} held by the worker ${Math.round(m.startupMs)} ms after it started, and at every reading`,
    statements: mergeStatements(w.counters),
    notes: [
      `check: ${check.text}; all ${n} held by the worker ${Math.round(m.startupMs)} ms after it started, and at every reading; at most ${m.backends} connection(s) to the database`,
      `recovery: ${RECOVERY[system] ?? 'n/a'}`,
      describe('window', win),
      describe('whole wait', wait),
      `WAL is server-wide; over the whole wait: ${quietText(wait)}`,
      ...([['window', m.walWindow, win], ['whole wait', m.walWait, wait]] as const).flatMap(([label, x, sp]) => {
        // The statistics lag (STATS_SETTLE_MS); the records do not. Say so when they part.
        const gap = x ? writesOf(sp) - writesOf(x) : 0;
        return x && Math.abs(gap) > Math.max(2, 0.05 * writesOf(x))
          ? [
              `${label}: pg_stat_user_tables counted ${gap > 0 ? `${gap} more` : `${-gap} fewer`} row writes than the WAL records hold: counts flushed late ` +
                '(a backend that goes idle within a second of its last flush keeps its counts until its next statement or 10 s idle); the WAL-record figure is the exact one',
            ]
          : [];
      }),
      ...([['window', m.walWindow, win], ['whole wait', m.walWait, wait]] as const).map(([label, x, sp]) =>
        x
          ? `from the WAL records (exact, this database only), ${label}: ${x.ins} inserted, ${x.upd} updated (${x.hot} HOT), ${x.del} deleted rows in schema ${SQL[system].schema} ` +
            `= ${(writesOf(x) / sp.seconds).toFixed(1)} row writes/s; this database's WAL ${Math.round(x.dbBytes / 1024).toLocaleString('en-US')} kB ` +
            `(${(x.dbBytes / 1024 / sp.seconds).toFixed(1)} kB/s, ${Math.round(x.fpiBytes / 1024).toLocaleString('en-US')} kB of it full-page images) ` +
            `of ${Math.round(x.allBytes / 1024).toLocaleString('en-US')} kB server-wide`
          : `from the WAL records, ${label}: not available`,
      ),
    ],
    ...(check.ok ? {} : { error: `not exactly once: ${check.text}` }),
  };
}

/**
 * The recovery phase's jobs wait this long: none finishes by itself while the
 * phase watches. (outlive's driver gives them a timeout of twice this, which
 * must fit in the worker's default pass budget of 300 s to be claimed.)
 */
const RECOVERY_SLEEP_MS = 120_000;
/**
 * The worker is killed this long after it holds every job: past outlive's
 * first renewal of its pass lease (every 15 s), so the kill lands where a
 * lease was last written mid-way through a long wait, not at the claim.
 */
const RECOVERY_KILL_AFTER_MS = 20_000;
/** The longest the phase waits for the jobs to be handed back (pg-boss promises 30-90 s). */
const RECOVERY_TIMEOUT_MS = 240_000;

/**
 * Recovery: one worker process holds `recoveryTasks` long jobs and is
 * SIGKILLed; a second process, already running and idle, is what notices.
 * Measures the time from the kill until no job is held under the dead
 * worker's claims any more (each is ready again or waiting for its retry),
 * and until the second process has started every one of them again.
 */
export async function recovery(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const heldSince = SQL[system].heldSince;
  if (!heldSince) throw new Error(`recovery: ${system} does not hand back a dead worker's jobs within a phase (${RECOVERY[system] ?? 'no recovery'})`);
  const n = ctx.sizes.recoveryTasks;
  const db = await freshDb(ctx, system);
  const enqueuer = await spawn(ctx, system);
  await enqueuer.call('open', { url: urlFor(db) });
  await enqueuer.call('enqueueBulk', { from: 0, count: n, chunk: n, sleepMs: RECOVERY_SLEEP_MS });
  await retire(ctx, enqueuer);

  const probe = await Probe.connect(db);
  const doomed = await spawn(ctx, system);
  const rescuer = await spawn(ctx, system);
  try {
    await doomed.call('open', { url: urlFor(db) });
    const goAt = epochMs();
    await doomed.call('startWorker', { concurrency: n, size: n });
    for (;;) {
      const [row] = await probe.rows<{ n: number }>(SQL[system].running);
      if (row!.n >= n && doomed.ran >= n) break;
      if (epochMs() - goAt > 120_000) throw new Error(`recovery: ${row!.n} of ${n} jobs held and ${doomed.ran} started after 120 s`);
      await sleep(50);
    }
    const heldAt = epochMs();
    // The rescuer starts idle: every job is held by the doomed worker.
    await rescuer.call('open', { url: urlFor(db) });
    await rescuer.call('startWorker', { concurrency: n, size: n });
    await sleep(heldAt + RECOVERY_KILL_AFTER_MS - epochMs());
    if (rescuer.ran > 0) throw new Error(`recovery: the second worker started ${rescuer.ran} jobs before the kill`);

    const killedAt = epochMs();
    await doomed.kill();
    ctx.live.delete(doomed);
    let releasedAt: number | null = null;
    let rerunAt: number | null = null;
    for (;;) {
      const [r] = await probe.rows<{ held: number; again: number }>(heldSince, [killedAt]);
      const at = epochMs();
      if (releasedAt === null && r!.held === 0) {
        if (r!.again !== n) throw new Error(`recovery: no job held any more, but only ${r!.again} of ${n} handed back`);
        releasedAt = at;
      }
      if (rerunAt === null && rescuer.ran >= n) rerunAt = at;
      if (releasedAt !== null && rerunAt !== null) break;
      if (at - killedAt > RECOVERY_TIMEOUT_MS) {
        throw new Error(`recovery: ${RECOVERY_TIMEOUT_MS / 1000} s after the kill, ${r!.held} of ${n} jobs still held by the dead worker and ${rescuer.ran} started again`);
      }
      await sleep(100);
    }
    const [left] = await probe.rows<{ n: number }>(SQL[system].remaining);
    if (left!.n !== n || rescuer.ran !== n) throw new Error(`recovery: ${left!.n} of ${n} jobs unfinished and ${rescuer.ran} started again (each should be once)`);
    const releasedSec = (releasedAt - killedAt) / 1000;
    const rerunSec = (rerunAt - killedAt) / 1000;
    return {
      phase: 'recovery',
      system,
      round: ctx.round,
      metrics: { releasedSec, rerunSec, startupMs: heldAt - goAt },
      check: `all ${n} jobs handed back once and started again once by the second worker`,
      notes: [
        `killed ${RECOVERY_KILL_AFTER_MS / 1000} s after it held all ${n} jobs (${Math.round(heldAt - goAt)} ms after it started); ` +
          `no job held by the dead worker ${releasedSec.toFixed(1)} s after the kill, all ${n} started again by the second worker after ${rerunSec.toFixed(1)} s`,
        `promise: ${RECOVERY[system] ?? 'n/a'}`,
      ],
    };
  } finally {
    await probe.close();
    // The jobs sleep for minutes: stopping a worker would wait for them.
    for (const child of [doomed, rescuer]) {
      await child.kill();
      ctx.live.delete(child);
    }
  }
}
