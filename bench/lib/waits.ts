/**
 * The waits phases (issue 27): steps that wait for a signal (`waitFor`) or a
 * time (`sleepStep`), measured from the outside, outlive only. Each phase
 * runs on a database of its own (benchwait_outlive, cloned from a template
 * made once per run) and reports in a section of its own of
 * docs/benchmarks.md (lib/report.ts, "Waits and signals").
 *
 * - signal-resume: runs of { w: waitFor(key), next } parked, a LISTEN worker
 *   idle over them; another process signals one key at a time, spaced like
 *   the latency phase, each one statement committing on its own: commit of the signal to
 *   the start of `next`. Again through the drain: after each commit a signed
 *   nudge to the Cloudflare Worker in Miniflare starts the pass.
 * - wait-cost: parked waits and sleeps, an hour long, under an idle LISTEN
 *   worker: row writes and WAL per second, read as the liveness phase reads
 *   them (lib/phases.ts).
 * - deadlines: parked waits whose deadlines are moved to one instant, half
 *   ending with a value, half failing: the time until all are settled, and
 *   the start latency of plain tasks enqueued meanwhile.
 */
import { Child } from './children.ts';
import type { PhaseName } from './config.ts';
import { holdWal, readStats, span, WalTally, writesOf, quietText, type Context, type PhaseResult, type StatSpan, type WalCount } from './phases.ts';
import { Probe, urlFor, type Admin } from './postgres.ts';
import { quantile } from './stats.ts';
import { epochMs, type SystemName } from '../systems/protocol.ts';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** The waits phases' database, and its migrated template (`_tpl`). */
const WAIT_DB = 'benchwait_outlive';
let prepared = false;

/** How long every wait of the phases waits unless moved: an hour, far past any phase. */
const HOUR_MS = 3_600_000;

/** A fresh database for a waits phase, cloned from its template (made on first use). */
async function waitDb(ctx: Context): Promise<string> {
  if (!prepared) {
    await ctx.admin.recreate(`${WAIT_DB}_tpl`);
    const child = await spawn(ctx);
    await op(child, 'install', { url: urlFor(`${WAIT_DB}_tpl`) });
    await retire(ctx, child);
    await ctx.admin.waitIdle(`${WAIT_DB}_tpl`);
    prepared = true;
  }
  await ctx.admin.recreate(WAIT_DB, `${WAIT_DB}_tpl`);
  return WAIT_DB;
}

/** Drops the waits database and its template (at the end of a run). */
export async function dropWaitDatabases(admin: Admin): Promise<void> {
  await admin.drop(WAIT_DB).catch(() => undefined);
  await admin.drop(`${WAIT_DB}_tpl`).catch(() => undefined);
  prepared = false;
}

async function spawn(ctx: Context): Promise<Child> {
  const child = await Child.start('outlive');
  ctx.live.add(child);
  return child;
}

async function retire(ctx: Context, ...children: Child[]): Promise<void> {
  await Promise.all(
    children.map(async (child) => {
      await op(child, 'close').catch(() => undefined);
      await child.stop();
      ctx.live.delete(child);
    }),
  );
}

const op = <T = unknown>(child: Child, fn: string, args: Record<string, unknown> = {}, timeoutMs?: number) => child.call<T>('waits', { fn, ...args }, timeoutMs);

const fmt = (n: number, digits = 1) => (Number.isFinite(n) ? (Math.abs(n) >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(digits)) : 'n/a');
const n0 = (n: number) => n.toLocaleString('en-US');

/** Polls `sql` (one row `{ n }`) until n equals `want`; throws after `timeoutMs`. */
async function until(probe: Probe, sql: string, want: number, timeoutMs: number, what: string): Promise<number> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const [row] = await probe.rows<{ n: number }>(sql);
    if (row!.n === want) return epochMs();
    if (performance.now() > deadline) throw new Error(`${what}: ${row!.n}, not ${want}, after ${timeoutMs / 1000} s`);
    await sleep(20);
  }
}

/** Waits parked now: pending rows of `$wait` with a deadline; with `keyed`, only waitFor's (a signal key). */
const parkedSql = (keyed: boolean | null) =>
  `SELECT count(*)::int AS n FROM outlive.tasks WHERE name = '$wait' AND state = 'pending' AND wait_until IS NOT NULL` +
  (keyed === null ? '' : keyed ? ' AND wait_key IS NOT NULL' : ' AND wait_key IS NULL');

/** Writes `count` runs of `kind` from `child` and parks their waits with tick() passes; checks that all parked. */
async function writeAndPark(
  ctx: Context,
  child: Child,
  probe: Probe,
  kind: 'signal' | 'wait' | 'sleep' | 'deadline',
  count: number,
  prefix: string,
): Promise<{ writeMs: number; parkMs: number; parked: number }> {
  const w = ctx.sizes.waits;
  const { ms: writeMs } = await op<{ ms: number }>(
    child,
    'writeRuns',
    { kind, count, prefix, timeoutMs: HOUR_MS, chunk: w.writeChunk, connections: w.writeConnections },
    3_600_000,
  );
  const r = await op<{ ms: number; parked: number; ended: number }>(child, 'park', { concurrency: w.parkConcurrency }, 3_600_000);
  if (r.ended > 0) throw new Error(`parking ${kind} runs: ${r.ended} wait(s) ended instead of parking`);
  return { writeMs, parkMs: r.ms, parked: r.parked };
}

const stats = (xs: number[]) => ({
  p50: quantile(xs, 0.5),
  p95: quantile(xs, 0.95),
  p99: quantile(xs, 0.99),
  max: xs.length ? Math.max(...xs) : NaN,
  mean: xs.length ? xs.reduce((s, x) => s + x, 0) / xs.length : NaN,
});

/** [i, before the call, after it committed, waits it ended] of each signal (systems/waits-outlive.ts). */
type SentSignal = [number, number, number, number];

/**
 * Pairs each signal with the start of its run's `next` (by index): the
 * latencies from the commit and from the call, and what was wrong (a signal
 * that ended no wait or more than one, a `next` started never or twice).
 */
function pair(sent: SentSignal[], starts: [number, number][], n: number): { fromCommit: number[]; fromCall: number[]; signalMs: number[]; problems: string[] } {
  const startsOf = new Map<number, number[]>();
  for (const [i, at] of starts) startsOf.set(i, [...(startsOf.get(i) ?? []), at]);
  const fromCommit: number[] = [];
  const fromCall: number[] = [];
  const signalMs: number[] = [];
  let notDelivered = 0;
  let never = 0;
  let twice = 0;
  for (const [i, t0, tc, delivered] of sent) {
    signalMs.push(tc - t0);
    if (delivered !== 1) notDelivered++;
    const s = startsOf.get(i) ?? [];
    if (s.length === 0) never++;
    else {
      if (s.length > 1) twice++;
      fromCommit.push(s[0]! - tc);
      fromCall.push(s[0]! - t0);
    }
  }
  const problems: string[] = [];
  if (sent.length !== n) problems.push(`${sent.length} of ${n} signals sent`);
  if (notDelivered) problems.push(`${notDelivered} signal(s) did not end exactly one wait`);
  if (never) problems.push(`${never} next step(s) never started`);
  if (twice) problems.push(`${twice} next step(s) started more than once`);
  const stray = starts.filter(([i]) => i < 0 || i >= n).length;
  if (stray) problems.push(`${stray} start(s) of runs not signalled`);
  return { fromCommit, fromCall, signalMs, problems };
}

/** The database's side of signal-resume: every wait succeeded once with its own payload, every `next` once, every run succeeded, every signal taken. */
async function checkResumed(probe: Probe, n: number, prefix: string): Promise<{ text: string; problems: string[] }> {
  const [r] = await probe.rows<{ waits: number; right: number; parkedOnce: number; nexts: number; nextOnce: number; runs: number; signals: number }>(
    `SELECT count(*) FILTER (WHERE t.step = 'w')::int AS waits,
            count(*) FILTER (WHERE t.step = 'w' AND t.state = 'succeeded' AND t.output = jsonb_build_object('i', substr(t.input->>'key', $1)::int))::int AS right,
            count(*) FILTER (WHERE t.step = 'w' AND t.snoozes = 1)::int AS "parkedOnce",
            count(*) FILTER (WHERE t.step = 'next' AND t.state = 'succeeded')::int AS nexts,
            count(*) FILTER (WHERE t.step = 'next' AND t.state = 'succeeded' AND t.attempts = 1)::int AS "nextOnce",
            (SELECT count(*)::int FROM outlive.runs WHERE state = 'succeeded') AS runs,
            (SELECT count(*)::int FROM outlive.signals WHERE delivered = 1 AND consumed_at IS NOT NULL) AS signals
     FROM outlive.tasks t`,
    [prefix.length + 1],
  );
  const text =
    `database: ${r!.right} of ${n} waits succeeded with their own signal's payload (${r!.parkedOnce} parked once), ` +
    `${r!.nextOnce} of ${n} next steps succeeded on their first attempt, ${r!.runs} runs succeeded, ${r!.signals} signals taken by one wait each`;
  const ok = r!.waits === n && r!.right === n && r!.parkedOnce === n && r!.nexts === n && r!.nextOnce === n && r!.runs === n && r!.signals === n;
  return { text, problems: ok ? [] : [text] };
}

/**
 * signal-resume: `signalRuns` runs of { w: waitFor('sr:<i>'), next } are
 * written, and a LISTEN worker (createWorker's defaults, concurrency as the
 * latency phase) parks their waits; once every one is parked and the worker
 * has sat idle `latencyIdleMs`, another process signals them one at a time,
 * `latencySpacingMs` apart, each one statement committing on its own, stamping the time
 * before the call and after it returned, committed (epoch ms, the latency phase's clock).
 * `next` stamps its start. Then the same through the drain, when
 * `signalDrain`: each commit followed by a signed nudge (respond-async) to
 * the Cloudflare Worker in Miniflare, whose pass resumes the run; `next`'s
 * start is when its printed line reaches the signalling process.
 */
export async function signalResume(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const w = ctx.sizes.waits;
  const n = w.signalRuns;
  const spacingMs = ctx.sizes.latencySpacingMs;
  const db = await waitDb(ctx);
  const url = urlFor(db);
  const probe = await Probe.connect(db);
  const signaler = await spawn(ctx);
  const worker = await spawn(ctx);
  const m: Record<string, number> = { runs: n, spacingMs };
  const notes: string[] = [];
  const problems: string[] = [];
  let samples: number[] = [];
  try {
    await op(signaler, 'open', { url });
    await op(signaler, 'writeRuns', { kind: 'signal', count: n, prefix: 'sr:', timeoutMs: HOUR_MS, chunk: n, connections: 1 });
    await probe.rows('ANALYZE');
    await op(worker, 'open', { url });
    const goAt = epochMs();
    await op(worker, 'startWorker', { concurrency: ctx.sizes.concurrency });
    const parkedAt = await until(probe, parkedSql(true), n, 60_000, 'signal-resume: waits parked by the worker');
    m.parkMs = parkedAt - goAt;
    await sleep(ctx.sizes.latencyIdleMs);
    const sent = await op<SentSignal[]>(signaler, 'signalSpaced', { prefix: 'sr:', count: n, spacingMs });
    const deadline = performance.now() + 60_000;
    while ((await op<{ next: number }>(worker, 'progress')).next < n && performance.now() < deadline) await sleep(20);
    await until(probe, `SELECT count(*)::int AS n FROM outlive.runs WHERE state = 'running'`, 0, 30_000, 'signal-resume: runs still running').catch((e: Error) =>
      problems.push(e.message),
    );
    // A moment more, for a `next` that would start twice.
    await sleep(300);
    const { seen } = await op<{ seen: { next: [number, number][] } }>(worker, 'stopWorker');
    const p = pair(sent, seen.next, n);
    problems.push(...p.problems);
    const db1 = await checkResumed(probe, n, 'sr:');
    problems.push(...db1.problems);
    samples = p.fromCommit;
    const c = stats(p.fromCommit);
    const call = stats(p.fromCall);
    Object.assign(m, c, { callP50: call.p50, callP95: call.p95, callP99: call.p99, callMax: call.max, signalMsP50: quantile(p.signalMs, 0.5) });
    notes.push(
      `LISTEN worker (createWorker, concurrency ${ctx.sizes.concurrency}): ${n} waits parked ${fmt(m.parkMs!, 0)} ms after it started; ${n} signals ${spacingMs} ms apart, ` +
        `each one statement committing on its own (p50 ${fmt(m.signalMsP50!, 2)} ms): commit to next's start p50 ${fmt(c.p50, 2)} / p95 ${fmt(c.p95, 2)} / p99 ${fmt(c.p99, 2)} / max ${fmt(c.max, 2)} ms; ` +
        `from before the call p50 ${fmt(call.p50, 2)} / p99 ${fmt(call.p99, 2)} ms`,
      `check: ${p.problems.length ? p.problems.join('; ') : `each of ${n} signals ended one wait and each next started once`}; ${db1.text}`,
    );
    await retire(ctx, worker, signaler);

    if (w.signalDrain) {
      // The same through the drain, on a fresh database.
      await probe.close();
      await ctx.admin.recreate(db, `${WAIT_DB}_tpl`);
      const probe2 = await Probe.connect(db);
      const host = await spawn(ctx);
      try {
        await op(host, 'open', { url });
        const r = await op<{
          signals: SentSignal[];
          enqueues: SentSignal[];
          starts: [number, number][];
          nudged: number;
          failedNudges: (number | null)[];
          startMs: number;
          parkMs: number;
          workerClock: [number, number][];
          output: string;
        }>(host, 'drainResume', { count: n, prefix: 'sd:', spacingMs, idleMs: ctx.sizes.latencyIdleMs, concurrency: ctx.sizes.concurrency, timeoutMs: HOUR_MS }, 600_000);
        const d = pair(r.signals, r.starts.filter(([i]) => i < n), n);
        // The drain's enqueue-to-start, indexes n to 2n: shifted to 0..n for pairing.
        const shift = (xs: [number, number][]) => xs.filter(([i]) => i >= n).map(([i, at]): [number, number] => [i - n, at]);
        const e = pair(r.enqueues.map(([i, t0, tc, x]): SentSignal => [i - n, t0, tc, x]), shift(r.starts), n);
        d.problems.push(...e.problems.filter((x) => !x.includes('did not end')).map((x) => `enqueued: ${x}`));
        const db2 = await checkResumed(probe2, n, 'sd:');
        if (r.failedNudges.length) d.problems.push(`${r.failedNudges.length} of ${r.nudged + r.failedNudges.length} nudges not accepted (statuses ${[...new Set(r.failedNudges)].join(', ')})`);
        problems.push(...d.problems.map((x) => `drain: ${x}`), ...db2.problems.map((x) => `drain: ${x}`));
        const c2 = stats(d.fromCommit);
        // workerd's own clock at the handler (it moves only at I/O, so at the claim's answer): a lower bound, beside the line's arrival.
        const wc = stats(pair(r.signals, r.workerClock.filter(([i]) => i < n), n).fromCommit);
        const ec = stats(e.fromCommit);
        const ecall = stats(e.fromCall);
        const call2 = stats(d.fromCall);
        Object.assign(m, {
          drainP50: c2.p50,
          drainP95: c2.p95,
          drainP99: c2.p99,
          drainMax: c2.max,
          drainMean: c2.mean,
          drainCallP50: call2.p50,
          drainCallP99: call2.p99,
          drainStartMs: r.startMs,
          drainWorkerClockP50: wc.p50,
          drainWorkerClockP99: wc.p99,
          drainEnqueueP50: ec.p50,
          drainEnqueueP95: ec.p95,
          drainEnqueueP99: ec.p99,
          drainEnqueueMax: ec.max,
          drainEnqueueCallP50: ecall.p50,
        });
        notes.push(
          `drain: after each commit a signed nudge (nudge(), respond-async) to POST /drain of the Cloudflare Worker (Neon driver, concurrency ${ctx.sizes.concurrency}) in Miniflare, ` +
            `its pass in the background (ctx.waitUntil); next's start timed when its printed line reached the signalling process: ` +
            `commit to start p50 ${fmt(c2.p50, 2)} / p95 ${fmt(c2.p95, 2)} / p99 ${fmt(c2.p99, 2)} / max ${fmt(c2.max, 2)} ms ` +
            `(by workerd's Date.now() at the handler, which moves only at I/O: p50 ${fmt(wc.p50, 2)} / p99 ${fmt(wc.p99, 2)} ms); Worker bundled and started in ${fmt(r.startMs, 0)} ms, not counted`,
          `drain, for comparison: ${n} tasks of the same step enqueued alone, ${spacingMs} ms apart, each committed then nudged: commit to start p50 ${fmt(ec.p50, 2)} / p95 ${fmt(ec.p95, 2)} / p99 ${fmt(ec.p99, 2)} / max ${fmt(ec.max, 2)} ms`,
          `drain check: ${d.problems.length ? d.problems.join('; ') : `each of ${n} signals ended one wait and each next started once`}; ${db2.text}`,
        );
        if (d.problems.length && r.output) notes.push(`workerd output (end): ${r.output.replace(/\s+/g, ' ').slice(-500)}`);
      } finally {
        await retire(ctx, host);
        await probe2.close();
      }
    } else notes.push('drain: not run (sizes.waits.signalDrain false)');
    return {
      phase: 'signal-resume',
      system,
      round: ctx.round,
      metrics: m,
      samples,
      notes,
      check: notes.filter((x) => x.includes('check:')).join('; '),
      ...(problems.length ? { error: problems.join('; ') } : {}),
    };
  } finally {
    await retire(ctx, worker, signaler);
    await probe.close().catch(() => undefined);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/** The idle worker's goals over parked waits (issue 27). */
export const WAIT_COST_GOALS = { writesPerSec: 2, walKBPerSec: 20 } as const;

/**
 * wait-cost: `costWaits` runs of one waitFor and `costSleeps` of one
 * sleepStep, an hour long, written with startRun and parked by tick()
 * passes; VACUUM ANALYZE (the server runs with autovacuum off); then a
 * LISTEN worker (createWorker's defaults: a pass every 2 s when idle,
 * retention on) sits over them for `costWindowMs`, and the row writes of
 * schema outlive (pg_stat_user_tables) and the WAL position are read before
 * and after, and the same span counted from the WAL records where the server
 * allows (as the liveness phase does, lib/phases.ts).
 */
export async function waitCost(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const w = ctx.sizes.waits;
  const db = await waitDb(ctx);
  const url = urlFor(db);
  const probe = await Probe.connect(db);
  const writer = await spawn(ctx);
  let worker: Child | null = null;
  try {
    await op(writer, 'open', { url });
    const a1 = await writeAndPark(ctx, writer, probe, 'wait', w.costWaits, 'wc:');
    const a2 = await writeAndPark(ctx, writer, probe, 'sleep', w.costSleeps, '');
    await retire(ctx, writer);
    const [keyed] = await probe.rows<{ n: number }>(parkedSql(true));
    const [timed] = await probe.rows<{ n: number }>(parkedSql(false));
    if (keyed!.n !== w.costWaits || timed!.n !== w.costSleeps) {
      throw new Error(`wait-cost: ${keyed!.n} of ${w.costWaits} waits and ${timed!.n} of ${w.costSleeps} sleeps parked`);
    }
    await probe.rows('VACUUM ANALYZE');
    const inspectable = await probe
      .rows('CREATE EXTENSION IF NOT EXISTS pg_walinspect')
      .then(() => true)
      .catch((err: Error) => {
        console.warn(`bench: wait-cost: no pg_walinspect (${err.message}); only the statistics are read`);
        return false;
      });
    const [xmin] = await probe.rows<{ x: string }>(`SELECT max(xmin::text::bigint)::text AS x FROM outlive.tasks`);

    worker = await spawn(ctx);
    await op(worker, 'open', { url });
    await op(worker, 'startWorker', { concurrency: ctx.sizes.concurrency });
    // Past the worker's first pass and first retention run, and their statistics flushed (see STATS_SETTLE_MS in lib/phases.ts).
    const settleDeadline = performance.now() + 30_000;
    while ((await op<{ passes: number }>(worker, 'progress')).passes < 1 && performance.now() < settleDeadline) await sleep(50);
    await sleep(3_000);
    const before = await op<{ passes: number }>(worker, 'progress');
    const held = inspectable && (await holdWal(probe));
    const a = await readStats(ctx, db, probe, 'outlive');
    await sleep(a.at + w.costWindowMs - epochMs());
    const b = await readStats(ctx, db, probe, 'outlive');
    const after = await op<{ passes: number }>(worker, 'progress');
    const tally = held ? new WalTally(probe, 'outlive', a.lsn) : null;
    await tally?.advance(b.lsn);
    const wal: WalCount | null = tally && !tally.broken ? tally.snapshot() : null;
    const { stats: workerStats } = await op<{ stats: { claimed: number; passes: number } }>(worker, 'stopWorker');
    await retire(ctx, worker);
    worker = null;

    const s: StatSpan = span(a, b);
    const [still] = await probe.rows<{ keyed: number; timed: number; touched: number }>(
      `SELECT count(*) FILTER (WHERE wait_key IS NOT NULL)::int AS keyed, count(*) FILTER (WHERE wait_key IS NULL)::int AS timed,
              count(*) FILTER (WHERE xmin::text::bigint > $1::bigint)::int AS touched
       FROM outlive.tasks WHERE name = '$wait' AND state = 'pending' AND wait_until IS NOT NULL`,
      [xmin!.x],
    );
    const m: Record<string, number> = {
      waits: w.costWaits,
      sleeps: w.costSleeps,
      windowSec: s.seconds,
      writesPerSec: writesOf(s) / s.seconds,
      hotWritesPerSec: s.hot / s.seconds,
      walKBPerSec: s.walBytes / 1024 / s.seconds,
      passes: after.passes - before.passes,
      otherWrites: s.otherWrites,
      otherCommits: s.otherCommits,
      checkpoints: s.checkpoints,
      writeRunsPerSec: (w.costWaits + w.costSleeps) / ((a1.writeMs + a2.writeMs) / 1000),
      parkPerSec: (w.costWaits + w.costSleeps) / ((a1.parkMs + a2.parkMs) / 1000),
      ...(wal ? { walRowWritesPerSec: writesOf(wal) / s.seconds, dbWalKBPerSec: wal.dbBytes / 1024 / s.seconds } : {}),
    };
    const rows = wal ? m.walRowWritesPerSec! : m.writesPerSec!;
    const kb = m.walKBPerSec!;
    m.goalMet = rows <= WAIT_COST_GOALS.writesPerSec && kb <= WAIT_COST_GOALS.walKBPerSec ? 1 : 0;
    const notes = [
      `${n0(w.costWaits)} waits and ${n0(w.costSleeps)} sleeps parked (written with startRun at ${fmt(m.writeRunsPerSec!, 0)} runs/s, ${w.writeChunk} per transaction on ${w.writeConnections} connections; ` +
        `parked by tick() passes at ${fmt(m.parkPerSec!, 0)}/s); a LISTEN worker (createWorker, concurrency ${ctx.sizes.concurrency}) idle over them for ${fmt(s.seconds)} s, ${m.passes} passes in the window`,
      `pg_stat_user_tables: ${s.ins} inserted, ${s.upd} updated (${s.hot} HOT), ${s.del} deleted rows in schema outlive = ${fmt(m.writesPerSec!, 2)} row writes/s; ` +
        `server-wide WAL (pg_current_wal_lsn) ${n0(Math.round(s.walBytes / 1024))} kB = ${fmt(kb, 2)} kB/s (goals: ≤ ${WAIT_COST_GOALS.writesPerSec} writes/s, ≤ ${WAIT_COST_GOALS.walKBPerSec} kB/s)`,
      wal
        ? `from the WAL records (exact, this database only): ${wal.ins} inserted, ${wal.upd} updated (${wal.hot} HOT), ${wal.del} deleted rows = ${fmt(m.walRowWritesPerSec!, 2)} row writes/s; ` +
          `this database's WAL ${fmt(m.dbWalKBPerSec!, 2)} kB/s of ${fmt(wal.allBytes / 1024 / s.seconds, 2)} kB/s server-wide`
        : 'from the WAL records: not available',
      `WAL is server-wide: ${quietText(s)}`,
      `check: ${still!.keyed} waits and ${still!.timed} sleeps still parked after the window, ${still!.touched} of them written since they parked; the worker claimed ${workerStats.claimed} task(s) in ${workerStats.passes} pass(es)`,
    ];
    const ok = still!.keyed === w.costWaits && still!.timed === w.costSleeps && still!.touched === 0;
    return {
      phase: 'wait-cost',
      system,
      round: ctx.round,
      metrics: m,
      notes,
      check: notes[notes.length - 1],
      ...(ok ? {} : { error: `parked waits were claimed or written while idle: ${notes[notes.length - 1]}` }),
    };
  } finally {
    if (worker) await retire(ctx, worker);
    await retire(ctx, writer);
    await probe.close().catch(() => undefined);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/**
 * deadlines: `deadlineWaits` runs of one waitFor (odd runs `onTimeout:
 * { value: null }`, even ones failing) are written and parked, an hour long;
 * one UPDATE then moves every deadline (run_at and wait_until) to one
 * instant T a few seconds ahead, and the table is vacuumed. A LISTEN worker
 * (createWorker, concurrency as the latency phase) is started, and another
 * process enqueues plain tasks one at a time, latencySpacingMs apart, from
 * before T until a second after every wait has settled. Measures, from the
 * rows: T to the first wait claimed and to the last settled; and the plain
 * tasks' enqueue-to-start latency, before T and during the storm.
 */
export async function deadlines(ctx: Context, system: SystemName): Promise<PhaseResult> {
  const w = ctx.sizes.waits;
  const n = w.deadlineWaits;
  const spacingMs = ctx.sizes.latencySpacingMs;
  const db = await waitDb(ctx);
  const url = urlFor(db);
  const probe = await Probe.connect(db);
  const writer = await spawn(ctx);
  let worker: Child | null = null;
  try {
    await op(writer, 'open', { url });
    const wp = await writeAndPark(ctx, writer, probe, 'deadline', n, 'dl:');
    const [parked] = await probe.rows<{ n: number }>(parkedSql(true));
    if (parked!.n !== n) throw new Error(`deadlines: ${parked!.n} of ${n} waits parked`);

    // The quiet samples (before T) take as long as the latency phase's jobs; the UPDATE and VACUUM about 0.1 ms a row.
    const quietMs = ctx.sizes.latencyCount * spacingMs;
    const T = epochMs() + quietMs + 3_000 + n * 0.1;
    const [moved] = await probe.rows<{ n: number }>(
      `WITH m AS (
         UPDATE outlive.tasks SET run_at = to_timestamp($1::float8 / 1000), wait_until = to_timestamp($1::float8 / 1000)
         WHERE name = '$wait' AND state = 'pending' AND wait_key IS NOT NULL RETURNING 1
       ) SELECT count(*)::int AS n FROM m`,
      [T],
    );
    if (moved!.n !== n) throw new Error(`deadlines: the UPDATE moved ${moved!.n} of ${n} deadlines`);
    await probe.rows('VACUUM ANALYZE');

    worker = await spawn(ctx);
    await op(worker, 'open', { url });
    await op(worker, 'startWorker', { concurrency: ctx.sizes.concurrency });
    const plainFrom = epochMs();
    await op(writer, 'startPlain', { spacingMs });
    const quietShort = T - plainFrom < quietMs;
    await sleep(T - epochMs());
    const timeoutMs = Math.max(120_000, n * 3);
    const left = `SELECT count(*)::int AS n FROM outlive.tasks WHERE name = '$wait' AND state IN ('pending', 'running')`;
    let seenSettledAt: number | null = null;
    let timedOut: string | null = null;
    try {
      seenSettledAt = await until(probe, left, 0, timeoutMs, 'deadlines: waits not settled');
    } catch (err) {
      timedOut = (err as Error).message;
    }
    await sleep(1_000);
    const sent = await op<[number, number][]>(writer, 'stopPlain');
    const deadline = performance.now() + 30_000;
    while ((await op<{ plain: number }>(worker, 'progress')).plain < sent.length && performance.now() < deadline) await sleep(20);
    await sleep(300);
    const { seen } = await op<{ seen: { plain: [number, number, number][] } }>(worker, 'stopWorker');
    await retire(ctx, worker);
    worker = null;

    const [r] = await probe.rows<{ first: number | null; last: number | null; lastClaim: number | null; valued: number; failed: number; other: number; runsOk: number; runsFailed: number }>(
      `SELECT extract(epoch FROM min(started_at)) * 1000 AS first, extract(epoch FROM max(finished_at)) * 1000 AS last,
              extract(epoch FROM max(started_at)) * 1000 AS "lastClaim",
              count(*) FILTER (WHERE state = 'succeeded' AND input ? 'onTimeout' AND (output IS NULL OR output = 'null'::jsonb))::int AS valued,
              count(*) FILTER (WHERE state = 'failed' AND NOT input ? 'onTimeout' AND last_error LIKE 'no signal%')::int AS failed,
              count(*) FILTER (WHERE state NOT IN ('succeeded', 'failed'))::int AS other,
              (SELECT count(*)::int FROM outlive.runs WHERE state = 'succeeded') AS "runsOk",
              (SELECT count(*)::int FROM outlive.runs WHERE state = 'failed') AS "runsFailed"
       FROM outlive.tasks WHERE name = '$wait'`,
    );
    const [plainDb] = await probe.rows<{ ok: number; all: number }>(
      `SELECT count(*) FILTER (WHERE state = 'succeeded' AND attempts = 1)::int AS ok, count(*)::int AS all FROM outlive.tasks WHERE name = 'wait-plain'`,
    );
    const first = Number(r!.first);
    const last = Number(r!.last);
    const settledAt = seenSettledAt ?? last;
    // Plain tasks: once each; latency by when they were enqueued.
    const counts = new Map<number, number>();
    for (const [i] of seen.plain) counts.set(i, (counts.get(i) ?? 0) + 1);
    const never = sent.filter(([i]) => !counts.has(i)).length;
    const twice = [...counts.values()].filter((c) => c > 1).length;
    const lat = (from: number, to: number) => seen.plain.filter(([, t]) => t >= from && t < to).map(([, t, at]) => at - t);
    const quiet = lat(-Infinity, T);
    const storm = lat(T, last);
    const afterStorm = lat(last, Infinity);
    const half = Math.floor(n / 2);
    const problems: string[] = [];
    if (timedOut) problems.push(timedOut);
    if (r!.valued !== n - half || r!.failed !== half || r!.other !== 0) {
      problems.push(`waits: ${r!.valued} of ${n - half} ended with their value, ${r!.failed} of ${half} failed with the timeout error, ${r!.other} not finished`);
    }
    if (r!.runsOk !== n - half || r!.runsFailed !== half) problems.push(`runs: ${r!.runsOk} succeeded (of ${n - half}), ${r!.runsFailed} failed (of ${half})`);
    if (never || twice || plainDb!.ok !== sent.length || plainDb!.all !== sent.length) {
      problems.push(`plain tasks: ${sent.length} enqueued, ${never} never started, ${twice} started more than once, ${plainDb!.ok} of ${plainDb!.all} rows succeeded on their first attempt`);
    }
    const sq = stats(quiet);
    const ss = stats(storm);
    const m: Record<string, number> = {
      waits: n,
      firstClaimMs: first - T,
      allSettledSec: (last - T) / 1000,
      settledSeenSec: (settledAt - T) / 1000,
      drainSec: (last - first) / 1000,
      waitsPerSec: n / ((last - first) / 1000),
      lastClaimSec: (Number(r!.lastClaim) - T) / 1000,
      stormP50: ss.p50,
      stormP95: ss.p95,
      stormP99: ss.p99,
      stormMax: ss.max,
      stormCount: storm.length,
      quietP50: sq.p50,
      quietP99: sq.p99,
      quietCount: quiet.length,
      afterP99: quantile(afterStorm, 0.99),
      parkPerSec: n / (wp.parkMs / 1000),
    };
    const notes = [
      `${n0(n)} parked waits (odd runs onTimeout { value: null }, even ones failing), deadlines moved to one instant T by one UPDATE; LISTEN worker (createWorker, concurrency ${ctx.sizes.concurrency}); ` +
        `first claimed ${fmt(m.firstClaimMs!, 0)} ms after T, all settled ${fmt(m.allSettledSec!, 2)} s after T (${fmt(m.drainSec!, 2)} s from the first claim: ${fmt(m.waitsPerSec!, 0)} waits/s)`,
      `plain tasks, one every ${spacingMs} ms from another process: enqueued during the storm (${storm.length}) start p50 ${fmt(ss.p50, 2)} / p95 ${fmt(ss.p95, 2)} / p99 ${fmt(ss.p99, 2)} / max ${fmt(ss.max, 2)} ms; ` +
        `before T (${quiet.length}) p50 ${fmt(sq.p50, 2)} / p99 ${fmt(sq.p99, 2)} ms; after (${afterStorm.length}) p99 ${fmt(m.afterP99!, 2)} ms` +
        (quietShort ? ` (the quiet part was shorter than planned: the UPDATE and VACUUM took longer)` : ''),
      `check: ${problems.length ? problems.join('; ') : `${n - half} waits ended with their value and ${half} failed at the deadline, every run finished, each of ${sent.length} plain tasks started once`}`,
    ];
    return {
      phase: 'deadlines',
      system,
      round: ctx.round,
      metrics: m,
      samples: storm,
      notes,
      check: notes[notes.length - 1],
      ...(problems.length ? { error: problems.join('; ') } : {}),
    };
  } finally {
    if (worker) await retire(ctx, worker);
    await retire(ctx, writer);
    await probe.close().catch(() => undefined);
    await ctx.admin.drop(db).catch(() => undefined);
  }
}

/** The step each waits phase is (outlive only). */
export const WAIT_STEPS: { phase: PhaseName; systems: readonly SystemName[]; run: (ctx: Context, system: SystemName) => Promise<PhaseResult> }[] = [
  { phase: 'signal-resume', systems: ['outlive'], run: signalResume },
  { phase: 'wait-cost', systems: ['outlive'], run: waitCost },
  { phase: 'deadlines', systems: ['outlive'], run: deadlines },
];
