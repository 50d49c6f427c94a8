/**
 * The waits of the chaos workload (issue 27): runs whose middle step waits
 * for a signal (`waitFor`) or sleeps (`sleepStep`), and the signaller that
 * sends each wait's signals at a seeded moment: before its run starts, while
 * its first step runs, once it is parked, or late; some two or three times
 * under one id, some a second signal under another id, sent in either order
 * or at once. A send whose answer a fault lost is sent again with the same
 * id, as an app would. Every choice is drawn when the run is planned, so a
 * seed replays the same plans however the sends interleave.
 */
import type pg from 'pg';
import { InvalidSignalError, signal, sleepStep, startRun, step, waitFor, type SignalResult, type Step } from '../../src/index.js';
import type { Prng } from './prng.js';
import type { Behaviour, chaosTasks } from './tasks.js';

/** Long past any chaos run, the final passes' clock included (a day and a few hundred hours ahead): no wait may time out. */
export const WAIT_TIMEOUT_MS = 60 * 86_400_000;

/** When a wait's first signal is sent. */
export type When = 'before' | 'start' | 'parked' | 'late';

/** One signal id of a plan, sent `copies` times. */
export interface PlannedSignal {
  id: string;
  payload: { run: string; seq: number };
  copies: number;
  /** The copies sent at once (a webhook delivered twice in parallel) rather than one after another. */
  together: boolean;
  /** Pause before it, after the previous id's sends returned. */
  gapMs: number;
}

/** One run of the waits' share of the workload. */
export interface WaitPlan {
  run: string;
  kind: 'signal' | 'sleep';
  key: string | null;
  /** The wait begins with the run, beside `start`, rather than after it. */
  rooted: boolean;
  start: Behaviour;
  sleepMs: number;
  when: When;
  /** before: from the first signal to the start; start: from the start; parked: from the park seen; late: from the start. */
  delayMs: number;
  /** In the order they are sent. */
  signals: PlannedSignal[];
  /** Two ids sent at once: which one the wait takes is not fixed. */
  racing: boolean;
  /** The later event (seq 2, id evt-2) sent before the earlier. */
  reordered: boolean;
}

/** What one send of one copy came to. */
export interface SendRecord {
  id: string;
  payload: unknown;
  /** Tries whose answer was lost (a cut, a restart): the commit may or may not have happened. */
  lost: number;
  /** The answer of the try that got one; absent if none did in time. */
  result?: SignalResult;
  /** Sent before the run's start was sent. */
  beforeRun: boolean;
}

/** What the signaller did for a plan. */
export interface WaitLog {
  plan: WaitPlan;
  /** The run's start committed (true), or its answer was lost (null). */
  started: boolean | null;
  sends: SendRecord[];
  /** The signaller saw the wait parked before it sent (only for `parked`). */
  sawParked: boolean;
}

/** Draws the plan of the `no`-th waiting run from `rng`. */
export function drawWaitPlan(rng: Prng, no: number): WaitPlan {
  const run = `wait-${no}`;
  const kind = rng.chance(0.25) ? 'sleep' : 'signal';
  // Only well-behaved first steps: a run that fails there never begins its wait.
  const mode = rng.weighted({ ok: 45, slow: 40, flaky: 15 });
  const start: Behaviour =
    mode === 'slow' ? { n: -2_000, mode, sleepMs: rng.int(100, 900) } : mode === 'flaky' ? { n: -2_000, mode, failUntil: 2 } : { n: -2_000, mode };
  const rooted = rng.chance(0.3);
  const sleepMs = kind === 'sleep' ? rng.int(20, 800) : 0;
  const when: When = rng.weighted({ before: 25, start: 30, parked: 30, late: 15 });
  const delayMs = when === 'late' ? rng.int(1_000, 4_000) : rng.int(0, when === 'start' ? 400 : 250);
  const ids = kind === 'signal' ? (rng.chance(0.3) ? 2 : 1) : 0;
  const reordered = ids === 2 && rng.chance(0.5);
  const racing = ids === 2 && when !== 'before' && rng.chance(0.25);
  const signals: PlannedSignal[] = [];
  for (let i = 0; i < ids; i++) {
    const seq = reordered ? ids - i : i + 1;
    const copies = rng.chance(0.35) ? rng.int(2, 3) : 1;
    signals.push({ id: `evt-${seq}`, payload: { run, seq }, copies, together: copies > 1 && rng.chance(0.5), gapMs: i === 0 ? 0 : rng.int(0, 1_500) });
  }
  return { run, kind, key: kind === 'signal' ? `chaos:${run}` : null, rooted, start, sleepMs, when, delayMs, signals, racing, reordered };
}

/** The steps of a plan's run: start, the wait (`w`) or sleep (`nap`), and `record`, which reads its output. */
export function waitRunSteps(plan: WaitPlan, tasks: ReturnType<typeof chaosTasks>): Record<string, Step> {
  const waitStep = plan.kind === 'signal' ? 'w' : 'nap';
  const where = plan.rooted ? {} : { after: ['start'] };
  const wait = plan.kind === 'signal' ? waitFor(plan.key!, { ...where, timeoutMs: WAIT_TIMEOUT_MS }) : sleepStep({ ms: plan.sleepMs }, where);
  return {
    start: step(tasks.plain, plan.start),
    [waitStep]: wait,
    record: step(tasks.record, { of: waitStep }, { after: plan.rooted ? ['start', waitStep] : [waitStep] }),
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What the signaller needs from the harness. */
export interface SignallerDeps {
  /** Where runs start and the park is watched from: the enqueues' pool. */
  pool: pg.Pool;
  /** Where signals go: through the proxy, so its drops and stalls hit them. */
  signalPool: pg.Pool;
  tasks: ReturnType<typeof chaosTasks>;
  onStarted(run: string, committed: boolean): void;
}

/** Sends one copy, again and again under the same id while its answer is lost; gives up after two minutes. */
async function sendCopy(deps: SignallerDeps, key: string, s: PlannedSignal, beforeRun: boolean): Promise<SendRecord> {
  const rec: SendRecord = { id: s.id, payload: s.payload, lost: 0, beforeRun };
  const until = Date.now() + 120_000;
  for (;;) {
    try {
      rec.result = await signal(deps.signalPool, key, s.payload, { id: s.id });
      return rec;
    } catch (err) {
      // A signal the library refuses is the harness's mistake, not a fault's.
      if (err instanceof InvalidSignalError) throw err;
      rec.lost++;
      if (Date.now() > until) return rec;
      await sleep(Math.min(1_000, 50 * 2 ** Math.min(rec.lost, 5)));
    }
  }
}

async function sendAll(deps: SignallerDeps, key: string, s: PlannedSignal, beforeRun: boolean): Promise<SendRecord[]> {
  if (s.together) return Promise.all(Array.from({ length: s.copies }, () => sendCopy(deps, key, s, beforeRun)));
  const out: SendRecord[] = [];
  for (let i = 0; i < s.copies; i++) out.push(await sendCopy(deps, key, s, beforeRun));
  return out;
}

/** Polls until the run's wait is parked (pending with its key set), for at most 15 s; true if it saw it. */
async function untilParked(pool: pg.Pool, run: string): Promise<boolean> {
  const until = Date.now() + 15_000;
  while (Date.now() < until) {
    const row = await pool
      .query<{ parked: boolean; ended: boolean }>(
        `SELECT t.state = 'pending' AND t.wait_key IS NOT NULL AS parked, t.state IN ('succeeded', 'failed', 'skipped') AS ended
         FROM outlive.tasks t JOIN outlive.runs r ON r.id = t.run_id WHERE r.name = $1 AND t.step = 'w'`,
        [run],
      )
      .then((r) => r.rows[0])
      .catch(() => undefined);
    if (row?.parked) return true;
    if (row?.ended) return false;
    await sleep(100);
  }
  return false;
}

/** Starts a plan's run and sends its signals as planned; resolves once every send has its answer (or gave up). */
export async function playWaitPlan(plan: WaitPlan, deps: SignallerDeps): Promise<WaitLog> {
  const log: WaitLog = { plan, started: null, sends: [], sawParked: false };
  const rest = [...plan.signals];
  if (plan.when === 'before' && rest.length > 0) {
    log.sends.push(...(await sendAll(deps, plan.key!, rest.shift()!, true)));
    await sleep(plan.delayMs);
  }
  try {
    await startRun(deps.pool, plan.run, waitRunSteps(plan, deps.tasks));
    log.started = true;
  } catch {
    log.started = null;
  }
  deps.onStarted(plan.run, log.started === true);
  if (rest.length === 0) return log;
  if (plan.when === 'parked') {
    log.sawParked = await untilParked(deps.pool, plan.run);
    await sleep(plan.delayMs);
  } else if (plan.when !== 'before') await sleep(plan.delayMs);
  if (plan.racing) {
    for (const sends of await Promise.all(rest.map((s) => sendAll(deps, plan.key!, s, false)))) log.sends.push(...sends);
    return log;
  }
  for (const s of rest) {
    await sleep(s.gapMs);
    log.sends.push(...(await sendAll(deps, plan.key!, s, false)));
  }
  return log;
}
