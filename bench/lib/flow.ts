/**
 * The flow-control phases (issue 26): per-key limits, fair turns and rates
 * as outlive enforces them in its claim (migration 0014), measured from the
 * outside, beside pg-boss and graphile-worker where they have something
 * comparable. Each phase runs on databases of its own (benchflow_*, cloned
 * from a template made once per run), and reports in a section of its own
 * of docs/benchmarks.md (lib/report.ts).
 *
 * - over-admission: processes claiming two keys (limits 1 and 5) with tasks
 *   holding 0-50 ms, some SIGKILLed mid-run and replaced; the most tasks of a
 *   key ever running at once, from each handler's start and end written to a
 *   table. outlive beside pg-boss's groupConcurrency.
 * - fairness: tenant A's backlog first, then tenant B one task every 100 ms:
 *   B's start latency against B alone on an idle queue; again with A's tasks
 *   spread over many concurrency keys, and B's share with weights 3:1.
 *   pg-boss and graphile-worker beside it (first in, first out).
 * - rate: keys with a rate (starts, and tokens per start) under 10
 *   processes: the most in any window of the period, the long-run rate, and
 *   no start while a 429's Retry-After holds (outlive only).
 * - claim-cost: Postgres CPU of the claim per 1,000 tasks claimed, with the
 *   backlog on 1, 100, 10,000 keys and on one key (outlive only).
 */
import { Child } from './children.ts';
import type { FlowSizes, PhaseName } from './config.ts';
import type { Context, PhaseResult } from './phases.ts';
import { Probe, urlFor, type Admin } from './postgres.ts';
import { quantile } from './stats.ts';
import { SQL } from './systems.ts';
import { epochMs, type SystemName, type WorkerReport } from '../systems/protocol.ts';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** The flow phases' databases: `<name>` for a phase, `<name>_tpl` for the migrated template. */
const FLOW_DB: Partial<Record<SystemName, string>> = {
  outlive: 'benchflow_outlive',
  'pg-boss': 'benchflow_pgboss',
  'graphile-worker': 'benchflow_graphile',
};
const prepared = new Set<SystemName>();

/** A fresh database for a flow phase of `system`, cloned from its template (made on first use). */
async function flowDb(ctx: Context, system: SystemName): Promise<string> {
  const db = FLOW_DB[system];
  if (!db) throw new Error(`flow: no database for ${system}`);
  if (!prepared.has(system)) {
    await ctx.admin.recreate(`${db}_tpl`);
    const child = await spawn(ctx, system);
    await child.call('install', { url: urlFor(`${db}_tpl`) });
    await retire(ctx, child);
    await ctx.admin.waitIdle(`${db}_tpl`);
    prepared.add(system);
  }
  await ctx.admin.recreate(db, `${db}_tpl`);
  return db;
}

/** Drops every flow database and template (at the end of a run). */
export async function dropFlowDatabases(admin: Admin): Promise<void> {
  for (const db of Object.values(FLOW_DB)) {
    await admin.drop(db).catch(() => undefined);
    await admin.drop(`${db}_tpl`).catch(() => undefined);
  }
  prepared.clear();
}

async function spawn(ctx: Context, system: SystemName): Promise<Child> {
  const child = await Child.start(system);
  ctx.live.add(child);
  return child;
}

/** Closes a process's flow state (or its driver's) and stops it. */
async function retire(ctx: Context, ...children: Child[]): Promise<void> {
  await Promise.all(
    children.map(async (child) => {
      if (child.system === 'outlive' || child.system === 'pg-boss') await child.call('flow', { fn: 'close' }).catch(() => undefined);
      await child.call('close').catch(() => undefined);
      await child.stop();
      ctx.live.delete(child);
    }),
  );
}

async function kill(ctx: Context, child: Child): Promise<void> {
  await child.kill();
  ctx.live.delete(child);
}

const flow = <T = unknown>(child: Child, fn: string, args: Record<string, unknown> = {}) => child.call<T>('flow', { fn, ...args });

async function withProbe<T>(db: string, fn: (probe: Probe) => Promise<T>): Promise<T> {
  const probe = await Probe.connect(db);
  try {
    return await fn(probe);
  } finally {
    await probe.close();
  }
}

const fmt = (n: number, digits = 1) => (Number.isFinite(n) ? (Math.abs(n) >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(digits)) : 'n/a');

// --- over-admission ------------------------------------------------------------

/** One handler's run: [start, end] in epoch ms, from benchflow_events. */
interface Span {
  key: string;
  proc: number;
  started: number;
  ended: number | null;
  id: string;
  attempt: number;
}

/**
 * The most intervals open at once, intervals [start, end) (an end at the
 * same instant as a start closes first), and how many starts took the count
 * above `limit`.
 */
export function maxOverlap(spans: readonly { start: number; end: number }[], limit: number): { max: number; over: number; at: number | null } {
  const points: [number, number][] = [];
  for (const s of spans) {
    points.push([s.start, 1]);
    points.push([Math.max(s.start, s.end), -1]);
  }
  points.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let open = 0;
  let max = 0;
  let over = 0;
  let at: number | null = null;
  for (const [t, d] of points) {
    open += d;
    if (d > 0 && open > limit) over++;
    if (open > max) {
      max = open;
      at = t;
    }
  }
  return { max, over, at };
}

/** When a killed process's running tasks could first be handed back: their lease (outlive) or heartbeat (pg-boss) expiry, epoch ms. */
const HELD_UNTIL: Partial<Record<SystemName, string>> = {
  outlive: `
SELECT t.id::text AS id, t.attempts AS attempt,
       extract(epoch FROM greatest(t.lease_expires_at, (SELECT l.expires_at FROM outlive.leases l WHERE l.owner = t.lease_owner))) * 1000 AS until
FROM outlive.tasks t WHERE t.id = ANY($1::bigint[]) AND t.state = 'running'`,
  'pg-boss': `
SELECT id::text AS id, retry_count AS attempt, extract(epoch FROM heartbeat_on + heartbeat_seconds * interval '1 second') * 1000 AS until
FROM pgboss.job WHERE name = 'flow' AND id = ANY($1::uuid[]) AND state = 'active'`,
};

/**
 * over-admission: `admissionProcesses` processes claim tasks of key k1
 * (concurrency 1) and k5 (concurrency 5) from a backlog larger than the
 * phase can run; every `admissionKillEveryMs` one of them (one running a
 * task, k1's first) is SIGKILLed and a new one started. Every handler writes
 * its start before it holds and its end after. The most running at once per
 * key is computed twice: a killed process's task ending when it was killed
 * (it ran no further), and, conservatively, when its lease expired (the
 * earliest its key could be given back).
 */
export async function overAdmission(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const f = ctx.sizes.flow;
  const db = await flowDb(ctx, system);
  const url = urlFor(db);
  const probe = await Probe.connect(db);
  const children = new Map<number, Child>();
  try {
    await probe.rows(
      `CREATE UNLOGGED TABLE benchflow_events (id text NOT NULL, attempt int NOT NULL, key text NOT NULL, proc int NOT NULL, started float8 NOT NULL, ended float8)`,
    );
    const enqueuer = await spawn(ctx, system);
    await flow(enqueuer, 'open', { url });
    await flow(enqueuer, 'enqueueAdmission', { k1: f.admissionK1, k5: f.admissionK5, timeoutMs: f.admissionTimeoutMs });
    await probe.rows('ANALYZE');

    let nextProc = 0;
    const startOne = async () => {
      const proc = nextProc++;
      const child = await spawn(ctx, system);
      await flow(child, 'open', { url, events: true });
      await flow(child, 'startAdmission', {
        proc,
        concurrency: f.admissionConcurrency,
        leaseGraceMs: f.admissionLeaseGraceMs,
        timeoutMs: f.admissionTimeoutMs,
      });
      children.set(proc, child);
    };
    await Promise.all(Array.from({ length: f.admissionProcesses }, () => startOne()));
    const startedAt = epochMs();
    const kills: { proc: number; at: number; open: number; held: Map<string, number> }[] = [];
    for (;;) {
      const next = startedAt + (kills.length + 1) * f.admissionKillEveryMs;
      if (next > startedAt + f.admissionMs - 1_000) break;
      await sleep(next - epochMs());
      // A process running a task, k1's first: a kill that cuts nothing tests nothing.
      const open = await probe.rows<{ proc: number; k1: boolean }>(
        `SELECT proc, bool_or(key = 'k1') AS k1 FROM benchflow_events WHERE ended IS NULL GROUP BY proc ORDER BY bool_or(key = 'k1') DESC, random()`,
      );
      const candidates = open.map((r) => r.proc).filter((p) => children.has(p));
      const procs = [...children.keys()];
      const proc = candidates[0] ?? procs[Math.floor(Math.random() * procs.length)]!;
      const victim = children.get(proc)!;
      const at = epochMs();
      await kill(ctx, victim);
      children.delete(proc);
      const cut = await probe.rows<{ id: string; attempt: number }>(`SELECT id, attempt FROM benchflow_events WHERE proc = $1 AND ended IS NULL`, [proc]);
      const held = new Map<string, number>();
      if (cut.length > 0) {
        const rows = await probe.rows<{ id: string; attempt: number; until: number }>(HELD_UNTIL[system]!, [cut.map((c) => c.id)]);
        for (const r of rows) held.set(`${r.id}:${r.attempt}`, Number(r.until));
      }
      kills.push({ proc, at, open: cut.length, held });
      await startOne();
    }
    await sleep(startedAt + f.admissionMs - epochMs());
    const stoppedAt = epochMs();
    await Promise.all([...children.values()].map((c) => flow(c, 'stopWorker')));
    await retire(ctx, ...children.values());
    children.clear();

    // outlive: once the dead processes' leases are over, recovery gives every slot back.
    let slots = '';
    let slotsOk = true;
    let leaked = 0;
    let recovered = 0;
    if (system === 'outlive') {
      const latest = Math.max(0, ...kills.flatMap((k) => [...k.held.values()]));
      await sleep(latest + 200 - epochMs());
      recovered = await flow<number>(enqueuer, 'recover');
      const keys = await probe.rows<{ key: string; running: number; rows: number }>(
        `SELECT l.key, l.running, (SELECT count(*)::int FROM outlive.tasks t WHERE t.state = 'running' AND t.limits @> jsonb_build_array(jsonb_build_object('k', l.key))) AS rows
         FROM outlive.limits l ORDER BY l.key`,
      );
      slotsOk = keys.every((k) => k.running === k.rows);
      leaked = keys.reduce((s, k) => s + Math.max(0, k.running - k.rows), 0);
      slots = keys.map((k) => `${k.key}: running ${k.running}, rows running ${k.rows}`).join('; ');
      const [lease] = await probe.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE errors @> '[{"name": "LeaseExpired"}]'`);
      recovered = lease!.n;
    }
    await retire(ctx, enqueuer);

    const rows = await probe.rows<Span>(`SELECT id, attempt, key, proc, started, ended FROM benchflow_events`);
    const killedAt = new Map(kills.map((k) => [k.proc, k.at]));
    const held = new Map(kills.flatMap((k) => [...k.held.entries()]));
    let unfinished = 0;
    let noLease = 0;
    const spansOf = (key: string, conservative: boolean) =>
      rows
        .filter((r) => r.key === key)
        .map((r) => {
          const start = Number(r.started);
          if (r.ended !== null) return { start, end: Number(r.ended) };
          const killed = killedAt.get(r.proc);
          if (killed === undefined) {
            // A live process stopped gracefully finishes its handlers: none should be open.
            if (!conservative) unfinished++;
            return { start, end: stoppedAt };
          }
          if (!conservative) return { start, end: killed };
          const until = held.get(`${r.id}:${r.attempt}`);
          if (until === undefined) noLease++;
          return { start, end: until ?? killed };
        });
    const limits = { k1: 1, k5: 5 } as const;
    const m: Record<string, number> = { processes: f.admissionProcesses, kills: kills.length, cut: kills.reduce((s, k) => s + k.open, 0), seconds: (stoppedAt - startedAt) / 1000 };
    for (const key of ['k1', 'k5'] as const) {
      const atKill = maxOverlap(spansOf(key, false), limits[key]);
      const atLease = maxOverlap(spansOf(key, true), limits[key]);
      m[`${key}Max`] = atKill.max;
      m[`${key}Over`] = atKill.over;
      m[`${key}MaxLease`] = atLease.max;
      m[`${key}OverLease`] = atLease.over;
      m[`${key}Starts`] = rows.filter((r) => r.key === key).length;
    }
    if (system === 'outlive') {
      m.recovered = recovered;
      m.slotsLeaked = leaked;
    }
    const within = m.k1Max! <= 1 && m.k5Max! <= 5;
    const withinLease = m.k1MaxLease! <= 1 && m.k5MaxLease! <= 5;
    m.goalMet = within && withinLease ? 1 : 0;
    const notes = [
      `${f.admissionProcesses} processes x concurrency ${f.admissionConcurrency} for ${fmt(m.seconds!)} s; ${kills.length} SIGKILLed (and replaced), cutting ${m.cut} running handler(s)` +
        (system === 'outlive' ? `; ${recovered} task(s) recovered after their lease expired` : ''),
      `most running at once, a killed task ending at its kill: k1 ${m.k1Max} (limit 1, ${m.k1Over} start(s) over), k5 ${m.k5Max} (limit 5, ${m.k5Over} over); ` +
        `ending when its lease expired: k1 ${m.k1MaxLease}, k5 ${m.k5MaxLease}`,
      `handlers started: k1 ${m.k1Starts}, k5 ${m.k5Starts}` + (unfinished > 0 ? `; ${unfinished} handler(s) of live processes never ended (counted to the stop)` : '') +
        (noLease > 0 ? `; ${noLease} cut task(s) no longer running when the lease was read (counted to the kill)` : ''),
    ];
    if (system === 'outlive') {
      notes.push(
        `slots after the stop and recovery: ${slots || 'no key rows'}` +
          (slotsOk
            ? ''
            : ` - SLOT LEAK: ${leaked} slot(s) held with no task running (tasks a pass handed back unstarted in a settle of their own give no slot back; docs/benchmarks.md, "Flow control")`),
      );
    }
    const errors: string[] = [];
    // outlive promises the limit: a breach fails the phase (as a job run twice fails a drain). pg-boss's figure is
    // reported as measured. A leaked slot (a liveness fault: the key runs below its limit from then on) is reported,
    // not failed: it comes from src/, which this harness measures and does not fix.
    if (system === 'outlive' && !within) errors.push(`outlive ran more than a key's limit at once: k1 ${m.k1Max}, k5 ${m.k5Max}`);
    return {
      phase: 'over-admission',
      system,
      round: ctx.round,
      metrics: m,
      notes,
      check: notes.join('; '),
      ...(errors.length ? { error: errors.join('; ') } : {}),
    };
  } finally {
    for (const child of children.values()) await kill(ctx, child);
    await probe.close();
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

// --- fairness -----------------------------------------------------------------

interface FairReport {
  aStarts: number[];
  bStarts: number[];
  bLatencies: number[];
}

/** One run of the fairness phase: B's start latencies, and what was started. */
interface FairRun {
  latencies: number[];
  bCount: number;
  aStarted: number;
  bStarted: number;
  share?: number;
  shareStarts?: number;
  aLeft?: number;
  bLeft?: number;
  /** outlive: how long B's enqueue calls took (their commit is part of B's latency). */
  enqueueMs?: number[];
}

type FairKind = 'idle' | 'loaded' | 'jitter' | 'prefetch0' | 'keys' | 'weighted';

/** Waits until every B task has run (outlive: succeeded; the peers' idle runs: no job left), or `maxMs`. */
async function waitBDone(probe: Probe, system: SystemName, maxMs: number): Promise<void> {
  // Done means run: a task claimed but still in a pass's prefetch buffer would be handed back unstarted by the stop.
  const sql =
    system === 'outlive'
      ? `SELECT count(*)::int AS n FROM outlive.tasks WHERE state <> 'succeeded' AND fair_key = 'B'`
      : SQL[system].remaining;
  const deadline = epochMs() + maxMs;
  while (epochMs() < deadline) {
    const [row] = await probe.rows<{ n: number }>(sql);
    if (row!.n === 0) return;
    await sleep(50);
  }
}

/** The processes of one system's fairness phase, kept across its runs (each run opens them on a fresh database and closes them after). */
interface FairProcs {
  enqueuer: Child;
  workers: Child[];
}

async function fairRunOutlive(ctx: Context, procs: FairProcs, kind: FairKind): Promise<FairRun> {
  const f = ctx.sizes.flow;
  const db = await flowDb(ctx, 'outlive');
  const url = urlFor(db);
  const variant = kind === 'keys' ? 'keys' : 'plain';
  const { enqueuer, workers } = procs;
  try {
    await flow(enqueuer, 'open', { url });
    const weighted = kind === 'weighted';
    if (weighted) await flow(enqueuer, 'setWeight', { key: 'B', weight: f.fairWeight });
    const aCount = kind === 'idle' ? 0 : weighted ? f.fairWeightedA : f.fairA;
    // 'jitter': A's tasks hold 0 to twice the hold at random (the same mean), so handlers free one by one, not in waves.
    if (aCount > 0) await flow(enqueuer, 'enqueueFair', { variant, tenant: 'A', count: aCount, hold: f.fairHoldMs, keys: f.fairKeys, jitter: kind === 'jitter' });
    if (weighted) await flow(enqueuer, 'enqueueFair', { variant, tenant: 'B', count: f.fairWeightedB, hold: f.fairHoldMs });
    await withProbe(db, (p) => p.rows('ANALYZE'));
    await Promise.all(workers.map((w) => flow(w, 'open', { url })));
    const goAt = epochMs();
    await Promise.all(
      workers.map((w) =>
        flow(w, 'startFair', { variant, concurrency: f.fairConcurrency, ...(kind === 'prefetch0' ? { mode: 'loop', prefetch: 0 } : { mode: 'worker' }) }),
      ),
    );
    let bCount = 0;
    let enqueueMs: number[] | undefined;
    if (weighted) await sleep(goAt + f.fairWeightedWarmMs + f.fairWeightedWindowMs + 200 - epochMs());
    else {
      // Idle: the workers sit idle first; loaded: A's backlog has them all busy first.
      await sleep(kind === 'idle' ? 1_000 : 2_000);
      bCount = kind === 'idle' ? f.fairIdle : f.fairB;
      ({ enqueueMs } = await flow<{ enqueueMs: number[] }>(enqueuer, 'enqueueSpacedB', { variant, count: bCount, spacingMs: f.fairSpacingMs, hold: f.fairHoldMs }));
      await withProbe(db, (p) => waitBDone(p, 'outlive', f.fairWaitMs));
    }
    const reports = await Promise.all(workers.map((w) => flow<{ fair: FairReport }>(w, 'stopWorker')));
    const aStarts = reports.flatMap((r) => r.fair.aStarts);
    const bStarts = reports.flatMap((r) => r.fair.bStarts);
    const run: FairRun = { latencies: reports.flatMap((r) => r.fair.bLatencies), bCount, aStarted: aStarts.length, bStarted: bStarts.length, enqueueMs };
    if (weighted) {
      const from = goAt + f.fairWeightedWarmMs;
      const to = from + f.fairWeightedWindowMs;
      const inWindow = (xs: number[]) => xs.filter((t) => t >= from && t < to).length;
      const a = inWindow(aStarts);
      const b = inWindow(bStarts);
      run.share = b / Math.max(1, a + b);
      run.shareStarts = a + b;
      run.aLeft = f.fairWeightedA - aStarts.length;
      run.bLeft = f.fairWeightedB - bStarts.length;
    } else if (kind !== 'idle') run.aLeft = f.fairA - aStarts.length;
    return run;
  } finally {
    await Promise.all([enqueuer, ...workers].map((c) => flow(c, 'close').catch(() => undefined)));
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/**
 * pg-boss and graphile-worker through their standard drivers (queue `noop`,
 * first in, first out), in processes of the run's own: graphile-worker 0.18
 * can leave a pool open after its stop (with jobs in its local queue, "Cannot
 * background something when the queue is already released", and at times
 * without), and a database dropped under an open pool kills its process; the
 * processes go first, then the database.
 */
async function fairRunPeer(ctx: Context, system: SystemName, kind: 'idle' | 'loaded'): Promise<FairRun> {
  const f = ctx.sizes.flow;
  const db = await flowDb(ctx, system);
  const url = urlFor(db);
  const enqueuer = await spawn(ctx, system);
  const workers: Child[] = [];
  for (let k = 0; k < f.fairWorkers; k++) workers.push(await spawn(ctx, system));
  try {
    await enqueuer.call('open', { url });
    if (kind === 'loaded') {
      await enqueuer.call('enqueueBulk', { from: 0, count: f.fairA, chunk: 20_000, sleepMs: f.fairHoldMs });
      await withProbe(db, (p) => p.rows('ANALYZE'));
    }
    for (const w of workers) await w.call('open', { url });
    await Promise.all(workers.map((w) => w.call('startWorker', { concurrency: f.fairConcurrency, size: f.fairA })));
    await sleep(kind === 'idle' ? 1_000 : 2_000);
    const bCount = kind === 'idle' ? f.fairIdle : f.fairB;
    // B's indexes start past A's, so the workers' per-job counts leave them out.
    await enqueuer.call('enqueueSpaced', { from: 10_000_000, count: bCount, spacingMs: f.fairSpacingMs, sleepMs: f.fairHoldMs });
    if (kind === 'idle') await withProbe(db, (p) => waitBDone(p, system, 10_000));
    else await sleep(f.fairWaitMs);
    const reports = await Promise.all(workers.map((w) => w.call<WorkerReport>('stopWorker')));
    const latencies = reports.flatMap((r) => r.latencies);
    const ran = reports.reduce((s, r) => s + r.ran, 0);
    return { latencies, bCount, aStarted: ran - latencies.length, bStarted: latencies.length, ...(kind === 'loaded' ? { aLeft: f.fairA - (ran - latencies.length) } : {}) };
  } finally {
    await retire(ctx, ...workers, enqueuer);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/**
 * fairness: B's start latency (enqueue call to handler start) with A's
 * backlog ahead of it and the workers saturated, against B alone on an idle
 * queue. outlive: with createWorker (its default prefetch), with a tick loop
 * that prefetches nothing, with A's tasks spread over `fairKeys` concurrency
 * keys, and B's share of starts with B weighted `fairWeight` to A's 1.
 */
export async function fairness(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const f = ctx.sizes.flow;
  const m: Record<string, number> = {};
  const notes: string[] = [];
  const waitedSec = ((f.fairB - 1) * f.fairSpacingMs + f.fairWaitMs) / 1000;
  const describe = (label: string, r: FairRun, idle: FairRun | null) => {
    const p50 = quantile(r.latencies, 0.5);
    const p99 = quantile(r.latencies, 0.99);
    const missing = r.bCount - r.bStarted;
    const ratio = idle ? p99 / quantile(idle.latencies, 0.99) : NaN;
    return (
      `${label}: B started ${r.bStarted} of ${r.bCount}` +
      (r.latencies.length ? `, p50 ${fmt(p50)} ms, p99 ${fmt(p99)} ms, max ${fmt(Math.max(...r.latencies))} ms` : '') +
      (idle && r.latencies.length ? ` (p99 ${fmt(ratio, 2)}x idle)` : '') +
      (missing > 0 ? `; ${missing} did not start within ${fmt(waitedSec)} s of the first B enqueue` : '') +
      (r.aLeft !== undefined ? `; A: ${r.aStarted.toLocaleString('en-US')} started, ${r.aLeft.toLocaleString('en-US')} still waiting at the end` : '') +
      (r.enqueueMs?.length ? `; B's enqueue call p50 ${fmt(quantile(r.enqueueMs, 0.5))} / p99 ${fmt(quantile(r.enqueueMs, 0.99))} ms` : '')
    );
  };
  const put = (prefix: string, r: FairRun, idle: FairRun | null) => {
    m[`${prefix}Count`] = r.bCount;
    m[`${prefix}Started`] = r.bStarted;
    if (r.latencies.length) {
      m[`${prefix}P50`] = quantile(r.latencies, 0.5);
      m[`${prefix}P99`] = quantile(r.latencies, 0.99);
    }
    if (idle && r.latencies.length) m[`${prefix}Ratio`] = quantile(r.latencies, 0.99) / quantile(idle.latencies, 0.99);
    if (r.aLeft !== undefined) m[`${prefix}ALeft`] = r.aLeft;
  };
  let idle: FairRun;
  const samples: number[] = [];
  // outlive's processes serve all five runs (each opens them on its fresh database and closes them after).
  const procs: FairProcs | null = system === 'outlive' ? { enqueuer: await spawn(ctx, system), workers: [] } : null;
  for (let k = 0; procs && k < f.fairWorkers; k++) procs.workers.push(await spawn(ctx, system));
  try {
    if (system === 'outlive') {
      idle = await fairRunOutlive(ctx, procs!, 'idle');
      put('idle', idle, null);
      notes.push(describe('idle queue (createWorker)', idle, null));
      for (const [kind, label] of [
        ['loaded', `behind A's ${f.fairA.toLocaleString('en-US')} (createWorker, default prefetch)`],
        ['jitter', `behind A's ${f.fairA.toLocaleString('en-US')} holding 0-${2 * f.fairHoldMs} ms at random (createWorker)`],
        ['prefetch0', `behind A's ${f.fairA.toLocaleString('en-US')} (tick loop, prefetch 0)`],
        ['keys', `behind A's ${f.fairA.toLocaleString('en-US')} over ${f.fairKeys.toLocaleString('en-US')} concurrency keys of 1 (createWorker)`],
      ] as const) {
        const r = await fairRunOutlive(ctx, procs!, kind);
        put(kind, r, idle);
        notes.push(describe(label, r, idle));
        if (kind === 'loaded') samples.push(...r.latencies);
      }
      const w = await fairRunOutlive(ctx, procs!, 'weighted');
      const target = f.fairWeight / (f.fairWeight + 1);
      m.weightedShare = w.share!;
      m.weightedTarget = target;
      m.weightedStarts = w.shareStarts!;
      notes.push(
        `weights B ${f.fairWeight} : A 1, both backlogged (A ${f.fairWeightedA.toLocaleString('en-US')}, B ${f.fairWeightedB.toLocaleString('en-US')}): ` +
          `B's share of the ${w.shareStarts} starts in ${f.fairWeightedWindowMs / 1000} s after ${f.fairWeightedWarmMs / 1000} s: ${fmt(w.share! * 100)} % (target ${fmt(target * 100)} %); ` +
          `left at the end: A ${w.aLeft}, B ${w.bLeft}`,
      );
      const ratioOk = (m.loadedRatio ?? Infinity) <= 2;
      const shareOk = Math.abs(w.share! - target) <= 0.05;
      m.goalLatency = ratioOk ? 1 : 0;
      m.goalShare = shareOk ? 1 : 0;
      if (w.bLeft === 0 || w.aLeft === 0) notes.push('NOTE: a tenant ran out of backlog inside the weighted window: its share is not the weights\'');
    } else {
      idle = await fairRunPeer(ctx, system, 'idle');
      put('idle', idle, null);
      notes.push(describe('idle queue', idle, null));
      const r = await fairRunPeer(ctx, system, 'loaded');
      put('loaded', r, idle);
      m.loadedWaitSec = waitedSec;
      notes.push(describe(`behind A's ${f.fairA.toLocaleString('en-US')} (first in, first out)`, r, idle));
      samples.push(...r.latencies);
    }
  } finally {
    if (procs) await retire(ctx, procs.enqueuer, ...procs.workers);
    await ctx.admin.drop(FLOW_DB[system]!).catch(() => undefined);
  }
  return { phase: 'fairness', system, round: ctx.round, metrics: m, notes, samples, check: notes.join('; ') };
}

// --- rate ---------------------------------------------------------------------

/** The most of `weight` within any window [t, t + period) of the sorted `points`. */
export function maxInWindow(points: readonly { at: number; w: number }[], periodMs: number): number {
  const p = [...points].sort((a, b) => a.at - b.at);
  let best = 0;
  let sum = 0;
  let i = 0;
  for (let j = 0; j < p.length; j++) {
    sum += p[j]!.w;
    while (p[j]!.at - p[i]!.at >= periodMs) sum -= p[i++]!.w;
    best = Math.max(best, sum);
  }
  return best;
}

/** Weight per period over the whole periods from the first start to `end`. */
function longRun(points: readonly { at: number; w: number }[], periodMs: number, end: number): { perPeriod: number; periods: number } {
  if (points.length === 0) return { perPeriod: 0, periods: 0 };
  const first = Math.min(...points.map((p) => p.at));
  const periods = Math.floor((end - first) / periodMs);
  if (periods < 1) return { perPeriod: NaN, periods: 0 };
  const sum = points.filter((p) => p.at < first + periods * periodMs).reduce((s, p) => s + p.w, 0);
  return { perPeriod: sum / periods, periods };
}

/**
 * rate: `rateProcesses` createWorker processes run five tasks from
 * backlogs: `rpm` (key rpm, rateRpm starts per period), `tpm` (key tpm,
 * rateTpm tokens per period, each task's estimate its cost), `rpm-spread`
 * and `tpm-spread` (the same rates with `burst: 1`), and `provider`
 * (key provider, concurrency 5), one of whose handlers, enqueued at
 * rate429AtMs ahead of the others, throws a 429 with a Retry-After. Claim
 * times are the tasks' started_at (the claim's clock, which the limit
 * governs); handler starts are what the provider would see.
 */
export async function rate(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const f = ctx.sizes.flow;
  const settings = {
    rpmLimit: f.rateRpm,
    tpmLimit: f.rateTpm,
    periodMs: f.ratePeriodMs,
    providerConcurrency: f.rateProviderConcurrency,
    retryAfterMs: f.rateRetryAfterMs,
  };
  const db = await flowDb(ctx, system);
  const url = urlFor(db);
  const workers: Child[] = [];
  const enqueuer = await spawn(ctx, system);
  const probe = await Probe.connect(db);
  try {
    await probe.rows(`CREATE TABLE benchflow_marks (name text PRIMARY KEY)`);
    await flow(enqueuer, 'open', { url });
    const periods = Math.ceil(f.rateMs / f.ratePeriodMs) + 1;
    const provider = Math.ceil(((f.rateMs / 1000) * f.rateProviderConcurrency * 1000) / f.rateProviderHoldMs);
    await flow(enqueuer, 'enqueueRate', {
      settings,
      rpm: f.rateRpm * periods,
      tpm: Math.ceil((f.rateTpm / f.rateEst[0]!) * periods),
      est: f.rateEst,
      provider,
      hold: f.rateProviderHoldMs,
    });
    await probe.rows('ANALYZE');
    for (let k = 0; k < f.rateProcesses; k++) workers.push(await spawn(ctx, system));
    await Promise.all(workers.map((w) => flow(w, 'open', { url })));
    const goAt = epochMs();
    await Promise.all(workers.map((w) => flow(w, 'startRate', { settings, concurrency: f.rateConcurrency })));
    await sleep(goAt + f.rate429AtMs - epochMs());
    await flow(enqueuer, 'enqueue429', { settings, hold: f.rateProviderHoldMs });
    await sleep(goAt + f.rateMs - epochMs());
    const stopAt = epochMs();
    const reports = await Promise.all(workers.map((w) => flow<{ rate: { starts: [string, number, number][]; thrownAt: number | null } }>(w, 'stopWorker')));

    const claims = await probe.rows<{ name: string; at: number; cost: number }>(
      `SELECT name, extract(epoch FROM started_at) * 1000 AS at, coalesce((input->>'est')::float8, 1) AS cost
       FROM outlive.tasks WHERE started_at IS NOT NULL AND state <> 'pending'`,
    );
    const [pause] = await probe.rows<{ until: number | null }>(`SELECT extract(epoch FROM paused_until) * 1000 AS until FROM outlive.limits WHERE key = 'provider'`);
    const handler = reports.flatMap((r) => r.rate.starts);
    const thrownAt = reports.map((r) => r.rate.thrownAt).find((t) => t !== null) ?? null;
    const by = (name: string, cost: boolean) => claims.filter((c) => c.name === name).map((c) => ({ at: Number(c.at), w: cost ? Number(c.cost) : 1 }));
    const byHandler = (key: string, cost: boolean) => handler.filter((s) => s[0] === key).map((s) => ({ at: s[1], w: cost ? s[2] : 1 }));
    const m: Record<string, number> = {};
    m.rpmLimit = f.rateRpm;
    m.tpmLimit = f.rateTpm;
    const notes = [`${f.rateProcesses} processes (createWorker, concurrency ${f.rateConcurrency}) for ${fmt((stopAt - goAt) / 1000)} s; period ${f.ratePeriodMs / 1000} s`];
    let goals = true;
    let wholePeriods = Infinity;
    // rpm and tpm admit a window's allowance at once; rpm-spread and tpm-spread the same rates with `burst: 1`.
    for (const [key, name, tokens, limit] of [
      ['rpm', 'rpm', false, f.rateRpm], ['tpm', 'tpm', true, f.rateTpm], ['rpmSpread', 'rpm-spread', false, f.rateRpm], ['tpmSpread', 'tpm-spread', true, f.rateTpm],
    ] as const) {
      const claimed = by(name, tokens);
      const started = byHandler(name, tokens);
      const long = longRun(claimed, f.ratePeriodMs, stopAt);
      m[`${key}Max`] = maxInWindow(claimed, f.ratePeriodMs);
      m[`${key}MaxHandler`] = maxInWindow(started, f.ratePeriodMs);
      m[`${key}LongRun`] = long.perPeriod;
      m[`${key}LongRunRatio`] = long.perPeriod / limit;
      wholePeriods = Math.min(wholePeriods, long.periods);
      goals &&= m[`${key}Max`]! <= limit && m[`${key}LongRunRatio`]! >= 0.95;
      // A provider that enforces its minute per second: the most in any period / limit (one start's share).
      const spacing = f.ratePeriodMs / f.rateRpm;
      if (!tokens) m[`${key}MaxHandlerShort`] = maxInWindow(started, spacing);
      notes.push(
        `${name}: most ${tokens ? 'tokens ' : ''}claimed in any ${f.ratePeriodMs / 1000} s window ${fmt(m[`${key}Max`]!)} (limit ${limit.toLocaleString('en-US')}; ` +
          `by handler start ${fmt(m[`${key}MaxHandler`]!)}${tokens ? '' : `; most handler starts in any ${fmt(spacing / 1000)} s ${m[`${key}MaxHandlerShort`]}`}); ` +
          `long run ${fmt(long.perPeriod)} per period over ${long.periods} whole period(s) (${fmt(m[`${key}LongRunRatio`]! * 100)} % of the limit)`,
      );
    }
    m.periods = wholePeriods;
    let pauseOk = false;
    if (pause?.until != null && thrownAt !== null) {
      const end = Number(pause.until);
      const start = end - f.rateRetryAfterMs;
      const prov = by('provider', false).map((p) => p.at);
      const provHandler = byHandler('provider', false).map((p) => p.at);
      const inPause = prov.filter((t) => t > start && t < end).length;
      const inPauseHandler = provHandler.filter((t) => t > start && t < end).sort((a, b) => a - b);
      const after = prov.filter((t) => t >= end).sort((a, b) => a - b);
      const before = prov.filter((t) => t <= start && t > start - f.rateRetryAfterMs).length;
      m.pauseClaims = inPause;
      m.pauseHandlerStarts = inPauseHandler.length;
      m.resumeLagMs = after.length ? after[0]! - end : NaN;
      m.providerPerSec = before / (f.rateRetryAfterMs / 1000);
      m.throwToPauseMs = start - thrownAt;
      pauseOk = inPause === 0 && inPauseHandler.length === 0;
      notes.push(
        `429 (Retry-After ${f.rateRetryAfterMs / 1000} s) thrown ${fmt((thrownAt - goAt) / 1000)} s in, the pause written ${fmt(start - thrownAt)} ms later: ` +
          `${inPause} claim(s) and ${inPauseHandler.length} handler start(s) of key provider during it` +
          (inPauseHandler.length ? ` (the handler starts ${inPauseHandler.map((t) => `${fmt(t - start, 0)} ms`).join(', ')} after the pause began)` : '') +
          `; first claim after it ${fmt(m.resumeLagMs, 0)} ms after its end; ${fmt(m.providerPerSec)} provider starts/s in the ${f.rateRetryAfterMs / 1000} s before it ` +
          `(the key allows ${f.rateProviderConcurrency} at once, each holding ${f.rateProviderHoldMs} ms: at most ${fmt((f.rateProviderConcurrency * 1000) / f.rateProviderHoldMs)}/s)`,
      );
    } else notes.push(`429: not observed (thrown: ${thrownAt !== null}, key paused: ${pause?.until != null})`);
    m.goalMet = goals && pauseOk ? 1 : 0;
    return {
      phase: 'rate',
      system,
      round: ctx.round,
      metrics: m,
      notes,
      check: notes.join('; '),
      ...(m.rpmMax! > f.rateRpm || m.tpmMax! > f.rateTpm || m.rpmSpreadMax! > f.rateRpm || m.tpmSpreadMax! > f.rateTpm
        ? { error: `a window held more than the rate: rpm ${m.rpmMax}, tpm ${m.tpmMax}, rpm-spread ${m.rpmSpreadMax}, tpm-spread ${m.tpmSpreadMax}` }
        : {}),
      ...(pause?.until == null || thrownAt === null ? { error: 'the 429 was not thrown or did not pause its key' } : {}),
    };
  } finally {
    await probe.close();
    await retire(ctx, ...workers, enqueuer);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

// --- claim cost ---------------------------------------------------------------

interface CostResult {
  claimed: number;
  claims: number;
  claimCpuMs: number;
  settleCpuMs: number;
  claimWallMs: number;
  maxClaimCpuMs: number;
}

/** The claim-cost variants: how many keys share how big a backlog; `full` cuts the one key's concurrency below the claim. */
function costVariants(f: FlowSizes): { id: string; label: string; keys: number; backlog: number; full?: true }[] {
  return [
    ...f.costKeys.map((k) => ({
      id: `k${k}`,
      label: `${k.toLocaleString('en-US')} key(s) sharing ${f.costBacklog.toLocaleString('en-US')}`,
      keys: k,
      backlog: f.costBacklog,
    })),
    { id: 'one', label: `1 key holding ${f.costOneKey.toLocaleString('en-US')}`, keys: 1, backlog: f.costOneKey },
    {
      id: 'full',
      label: `1 key holding ${f.costOneKey.toLocaleString('en-US')}, concurrency cut to ${f.costFullConcurrency}`,
      keys: 1,
      backlog: f.costOneKey,
      full: true,
    },
  ];
}

export { costVariants };

/** A system as its process describes itself, for runs of flow phases only (no standard template is made). */
export async function describeSystem(ctx: Context, system: SystemName): Promise<{ version: string; settings: string; node: string }> {
  const child = await spawn(ctx, system);
  try {
    return await child.call('hello', { concurrency: ctx.sizes.flow.fairConcurrency });
  } finally {
    await child.stop();
    ctx.live.delete(child);
  }
}

/**
 * claim-cost: each variant's backlog is enqueued (tasks with a concurrency
 * limit on key k<i % keys>, the limit equal to the claim so that one key can
 * fill a claim), then one connection claims `costMeasure` tasks,
 * `costLimit` per claim, settling each batch before the next; the Postgres
 * CPU of its backend is read around each claim and each settle. The last
 * variant cuts the one key's concurrency (setLimit) below the claim: every
 * claim then finds the key full and sets the rows it read aside (blocked_on).
 */
export async function claimCost(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const f = ctx.sizes.flow;
  const m: Record<string, number> = {};
  const notes: string[] = [];
  const db = FLOW_DB[system]!;
  let child: Child | null = null;
  try {
    for (const v of costVariants(f)) {
      if (!v.full) {
        if (child) await retire(ctx, child);
        await flowDb(ctx, system);
        child = await spawn(ctx, system);
        await flow(child, 'open', { url: urlFor(db) });
        await flow(child, 'enqueueCost', { keys: v.keys, count: v.backlog, concurrency: f.costLimit });
        await withProbe(db, (p) => p.rows('ANALYZE'));
      } else await flow(child!, 'setLimit', { key: 'k0', concurrency: f.costFullConcurrency });
      const r = await flow<CostResult>(child!, 'claimCost', { limit: f.costLimit, measure: f.costMeasure, warmup: 3 });
      m[`claimCpu_${v.id}`] = (r.claimCpuMs / r.claimed) * 1000;
      m[`settleCpu_${v.id}`] = (r.settleCpuMs / r.claimed) * 1000;
      m[`claimSize_${v.id}`] = r.claimed / r.claims;
      m[`claimCpuPerClaim_${v.id}`] = r.claimCpuMs / r.claims;
      m[`claimWall_${v.id}`] = r.claimWallMs / r.claims;
      notes.push(
        `${v.label}: ${r.claimed.toLocaleString('en-US')} claimed in ${r.claims} claims (${fmt(r.claimed / r.claims)} each): claim ${fmt(m[`claimCpu_${v.id}`]!)} ms CPU per 1,000 ` +
          `(${fmt(r.claimCpuMs / r.claims, 2)} ms a claim, at most ${fmt(r.maxClaimCpuMs, 2)}; ${fmt(r.claimWallMs / r.claims, 2)} ms at the client), settle ${fmt(m[`settleCpu_${v.id}`]!)} ms per 1,000`,
      );
    }
    // The same claims (of costLimit) on 1 to 10,000 keys and on one key with a bigger backlog.
    const same = costVariants(f).filter((v) => !v.full).map((v) => m[`claimCpu_${v.id}`]!);
    m.spread = Math.max(...same) / Math.min(...same);
    m.goalMet = m.spread <= 1.5 ? 1 : 0;
    notes.push(`claim CPU per 1,000, most / least over the variants with full claims: ${fmt(m.spread, 2)}x`);
    return { phase: 'claim-cost', system, round: ctx.round, metrics: m, notes, check: notes.join('; ') };
  } finally {
    if (child) await retire(ctx, child);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/** The step each flow phase is: which systems take part, and how it runs one. */
export const FLOW_STEPS: { phase: PhaseName; systems: readonly SystemName[]; run: (ctx: Context, system: SystemName) => Promise<PhaseResult> }[] = [
  { phase: 'over-admission', systems: ['outlive', 'pg-boss'], run: overAdmission },
  { phase: 'fairness', systems: ['outlive', 'pg-boss', 'graphile-worker'], run: fairness },
  { phase: 'rate', systems: ['outlive'], run: rate },
  { phase: 'claim-cost', systems: ['outlive'], run: claimCost },
];
