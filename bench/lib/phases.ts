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
  beforeWait: () => Promise<void> = async () => undefined,
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
  await Promise.all(children.map((c) => c.call('startWorker', { concurrency: ctx.sizes.concurrency, size: n })));
  await beforeWait();
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

