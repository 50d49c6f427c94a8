/**
 * A model of runs, checked against the real engine on random graphs.
 *
 * fast-check draws a run: a DAG of steps, each with a script of outcomes
 * (success, retry, failure for good), some not yet due, some spawning steps
 * that wait for their spawner, for siblings spawned in the same attempt and
 * for steps already in the run (succeeded, pending, not yet due or running);
 * then rounds of passes (one to three at once, of random concurrency, so
 * settles batch differently), and maybe a cancel or a retry of the run. After
 * every round the rows must agree with the rules of the README, and once the
 * run has finished its tasks' states must be those a plain in-memory model of
 * the rules gives.
 *
 * `OUTLIVE_PROPERTY_RUNS` sets how many runs (default 100) and
 * `OUTLIVE_PROPERTY_SEED` (with `OUTLIVE_PROPERTY_PATH`, the path fast-check
 * prints) replays one; a failure prints the seed and the shrunk run.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { cancelRun, defineTask, NonRetriableError, retryRun, startRun, step, tick, type Step } from '../src/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

type Outcome = 'ok' | 'retry' | 'fail';

/** A step as drawn: what it waits for, its script, when it is due, what it spawns when it succeeds. */
interface StepSpec {
  name: string;
  after: string[];
  /** Outcome of each start of this step, in order, across retries of the run; 'ok' once it runs out. */
  script: Outcome[];
  maxAttempts: number;
  /** Rounds from the start before it is due. */
  dueRound: number;
  /** Handler returns without awaiting (settles with whatever else finished at once), or awaits this many ms. */
  delayMs: number;
  spawns: StepSpec[];
}

interface Scenario {
  steps: StepSpec[];
  /** Per round: how many passes at once and each one's concurrency. */
  rounds: { passes: number; concurrency: number; prefetch: number }[];
  /** Cancel the run beside the passes of this round, if any. */
  cancelAt: number | null;
  /** Once the run has finished failed or cancelled, retry it (once). */
  retry: boolean;
}

const FINAL = new Set(['succeeded', 'failed', 'skipped', 'cancelled']);

// ---------------------------------------------------------------------------
// The reference model: the README's rules, with nothing of the engine in it.
// ---------------------------------------------------------------------------

interface ModelState {
  /** Final state of each step known to exist. */
  states: Map<string, 'succeeded' | 'failed' | 'skipped'>;
  /** The steps of the run: the initial ones and what succeeded spawners spawned. */
  steps: Map<string, StepSpec>;
}

/**
 * Plays the rules forward from `succeeded` (steps already done) and `starts`
 * (how often each step has started): a step runs once every step it waits
 * for has succeeded, and is skipped once one of them failed or was skipped;
 * a run attempt's outcomes come from its script; a success adds its spawns.
 */
function model(scn: Scenario, succeeded: ReadonlySet<string>, startsBefore: ReadonlyMap<string, number>): ModelState {
  const steps = new Map<string, StepSpec>();
  const add = (s: StepSpec) => steps.set(s.name, s);
  scn.steps.forEach(add);
  const states = new Map<string, 'succeeded' | 'failed' | 'skipped'>();
  for (const name of succeeded) {
    states.set(name, 'succeeded');
  }
  // Spawns of spawners that succeeded already exist.
  let grew = true;
  while (grew) {
    grew = false;
    for (const s of [...steps.values()]) {
      if (states.get(s.name) === 'succeeded') for (const c of s.spawns) if (!steps.has(c.name)) (add(c), (grew = true));
    }
  }
  const starts = new Map(startsBefore);
  for (let changed = true; changed; ) {
    changed = false;
    for (const s of [...steps.values()]) {
      if (states.has(s.name)) continue;
      const deps = s.after.map((d) => states.get(d));
      if (deps.some((d) => d === 'failed' || d === 'skipped')) {
        states.set(s.name, 'skipped');
        changed = true;
        continue;
      }
      if (!deps.every((d) => d === 'succeeded')) continue;
      let outcome: 'succeeded' | 'failed' = 'failed';
      for (let attempt = 1; attempt <= s.maxAttempts; attempt++) {
        const n = starts.get(s.name) ?? 0;
        starts.set(s.name, n + 1);
        const o = s.script[n] ?? 'ok';
        if (o === 'ok') {
          outcome = 'succeeded';
          break;
        }
        if (o === 'fail') break;
      }
      states.set(s.name, outcome);
      if (outcome === 'succeeded') s.spawns.forEach(add);
      changed = true;
    }
  }
  return { states, steps };
}

// ---------------------------------------------------------------------------
// Drawing runs.
// ---------------------------------------------------------------------------

const outcome = fc.constantFrom<Outcome>('ok', 'ok', 'retry', 'fail');

function stepArb(name: string, candidates: string[], spawnsOf: fc.Arbitrary<StepSpec[]>): fc.Arbitrary<StepSpec> {
  return fc.record({
    name: fc.constant(name),
    after: candidates.length === 0 ? fc.constant([]) : fc.subarray(candidates, { maxLength: Math.min(3, candidates.length) }),
    script: fc.array(outcome, { maxLength: 3 }),
    maxAttempts: fc.integer({ min: 1, max: 3 }),
    dueRound: fc.constantFrom(0, 0, 0, 1, 3),
    delayMs: fc.constantFrom(0, 0, 1, 3),
    spawns: spawnsOf,
  });
}

/** Spawns of one spawner: each waits for some of its spawner, its earlier siblings and the run's initial steps. */
function spawnsArb(spawner: string, initial: string[]): fc.Arbitrary<StepSpec[]> {
  return fc.integer({ min: 0, max: 3 }).chain((n) => {
    const arbs: fc.Arbitrary<StepSpec>[] = [];
    for (let k = 0; k < n; k++) {
      const siblings = Array.from({ length: k }, (_, j) => `${spawner}.${j}`);
      arbs.push(stepArb(`${spawner}.${k}`, [spawner, ...siblings, ...initial.filter((s) => s !== spawner)], fc.constant([])));
    }
    return arbs.length === 0 ? fc.constant<StepSpec[]>([]) : fc.tuple(...arbs).map((t): StepSpec[] => [...t]);
  });
}

const scenarioArb: fc.Arbitrary<Scenario> = fc.integer({ min: 1, max: 7 }).chain((n) => {
  const names = Array.from({ length: n }, (_, i) => `s${i}`);
  const steps = names.map((name, i) =>
    stepArb(name, names.slice(0, i), fc.oneof({ weight: 2, arbitrary: fc.constant<StepSpec[]>([]) }, { weight: 1, arbitrary: spawnsArb(name, names) })),
  );
  return fc.record({
    steps: fc.tuple(...steps).map((t): StepSpec[] => [...t]),
    rounds: fc.array(fc.record({ passes: fc.integer({ min: 1, max: 3 }), concurrency: fc.integer({ min: 1, max: 4 }), prefetch: fc.constantFrom(0, 4, 1000) }), {
      minLength: 1,
      maxLength: 4,
    }),
    cancelAt: fc.option(fc.integer({ min: 0, max: 4 }), { freq: 5 }),
    retry: fc.boolean(),
  });
});

// ---------------------------------------------------------------------------
// Running a drawn run against the engine.
// ---------------------------------------------------------------------------

/** What the handlers saw, for the scenario being played. */
interface Observed {
  scn: Scenario;
  runId: string;
  specs: Map<string, StepSpec>;
  starts: Map<string, number>;
  running: Set<string>;
  violations: string[];
}

let current: Observed | null = null;

const prop = defineTask({
  name: 'prop',
  input: z.object({ s: z.string() }),
  retry: { maxAttempts: 3, backoff: { baseMs: 1_000, maxMs: 1_000, jitter: 'none' } },
  run: async ({ s }, ctx) => {
    const o = current!;
    const spec = o.specs.get(s)!;
    if (o.running.has(ctx.taskId)) o.violations.push(`${s} (task ${ctx.taskId}) started while another attempt of it ran`);
    o.running.add(ctx.taskId);
    try {
      // Every step it waits for has succeeded, as committed now.
      const deps = await db.rows<{ step: string; state: string }>(
        `SELECT step, state::text FROM outlive.tasks WHERE run_id = $1 AND step = ANY($2::text[])`,
        [o.runId, spec.after],
      );
      const notDone = spec.after.filter((d) => deps.find((r) => r.step === d)?.state !== 'succeeded');
      if (notDone.length > 0) o.violations.push(`${s} started before ${notDone.join(', ')} succeeded`);
      const n = o.starts.get(s) ?? 0;
      o.starts.set(s, n + 1);
      if (spec.delayMs > 0) await new Promise((r) => setTimeout(r, spec.delayMs));
      const outcome = spec.script[n] ?? 'ok';
      if (outcome === 'fail') throw new NonRetriableError(`${s} failed for good`);
      if (outcome === 'retry') throw new Error(`${s} asks for another attempt`);
      for (const c of spec.spawns) ctx.spawn(c.name, stepOf(c));
      return s;
    } finally {
      o.running.delete(ctx.taskId);
    }
  },
});

let T0 = Date.now();
const roundTime = (r: number) => new Date(T0 + r * 60_000);

function stepOf(spec: StepSpec): Step {
  return step(prop, { s: spec.name }, { after: spec.after, maxAttempts: spec.maxAttempts, runAt: spec.dueRound > 0 ? roundTime(spec.dueRound) : undefined });
}

/** The invariants that hold after any round, whatever has happened. */
async function checkRows(o: Observed, where: string): Promise<void> {
  expect(o.violations, where).toEqual([]);
  const tasks = await db.rows<{ id: string; step: string; state: string; waiting_on: number; unfinished_deps: number; listed: boolean }>(
    `SELECT t.id::text, t.step, t.state::text, t.waiting_on,
            (SELECT count(*)::int FROM outlive.task_deps d LEFT JOIN outlive.tasks p ON p.id = d.depends_on
              WHERE d.task_id = t.id AND p.state IS DISTINCT FROM 'succeeded') AS unfinished_deps,
            EXISTS (SELECT 1 FROM outlive.recounts r WHERE r.task_id = t.id) AS listed
     FROM outlive.tasks t WHERE t.run_id = $1 ORDER BY t.id`,
    [o.runId],
  );
  for (const t of tasks) {
    expect(t.waiting_on, `${where}: ${t.step} waiting_on`).toBeGreaterThanOrEqual(0);
    if (t.state !== 'pending') continue;
    // A row a spawn listed as unsure may count a step that has since succeeded, until recovery recounts it.
    if (t.listed) expect(t.waiting_on, `${where}: ${t.step} (listed for a recount)`).toBeGreaterThanOrEqual(t.unfinished_deps);
    else expect(t.waiting_on, `${where}: ${t.step} waits for its unfinished dependencies`).toBe(t.unfinished_deps);
  }
  const [run] = await db.rows<{ state: string; unfinished: number }>(`SELECT state::text, unfinished FROM outlive.runs WHERE id = $1`, [o.runId]);
  const open = tasks.filter((t) => !FINAL.has(t.state)).length;
  if (run!.state === 'running') expect(run!.unfinished, `${where}: the run counts its unfinished tasks`).toBe(open);
  else expect(open, `${where}: a finished run (${run!.state}) has no unfinished task`).toBe(0);
}

async function play(scn: Scenario): Promise<void> {
  await db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks; DELETE FROM outlive.recounts');
  T0 = Date.now();
  const specs = new Map<string, StepSpec>();
  for (const s of scn.steps) {
    specs.set(s.name, s);
    for (const c of s.spawns) specs.set(c.name, c);
  }
  const run = await startRun(db.pool, 'property', Object.fromEntries(scn.steps.map((s) => [s.name, stepOf(s)])));
  const o: Observed = { scn, runId: run.id, specs, starts: new Map(), running: new Set(), violations: [] };
  current = o;
  let succeededAtRetry = new Set<string>();
  let startsAtRetry = new Map<string, number>();
  let retried = false;
  let succeededAtCancel: string[] | null = null;
  const runState = async () => (await db.rows<{ state: string }>(`SELECT state::text FROM outlive.runs WHERE id = $1`, [run.id]))[0]!.state;
  const succeededSteps = async () =>
    (await db.rows<{ step: string }>(`SELECT step FROM outlive.tasks WHERE run_id = $1 AND state = 'succeeded' ORDER BY step`, [run.id])).map((r) => r.step);

  for (let r = 0; r < 60; r++) {
    const shape = scn.rounds[r % scn.rounds.length]!;
    const now = roundTime(r);
    const passes = Array.from({ length: shape.passes }, () => tick(db.pool, { tasks: [prop], concurrency: shape.concurrency, prefetch: shape.prefetch, now }));
    try {
      if (scn.cancelAt === r) {
        const report = await cancelRun(db.pool, run.id, { now });
        if (report.cancelled) succeededAtCancel = await succeededSteps();
      }
    } finally {
      // Whatever failed, the passes end before the next run (a shrink) begins.
      const settled = await Promise.allSettled(passes);
      for (const p of settled) if (p.status === 'rejected') throw p.reason;
    }
    await checkRows(o, `round ${r}`);
    const state = await runState();
    if (state === 'running') continue;
    if (succeededAtCancel && state === 'cancelled') {
      // Nothing succeeded after the cancel committed.
      expect(await succeededSteps(), 'succeeded after the cancel').toEqual(succeededAtCancel);
    }
    if (scn.retry && !retried && (state === 'failed' || state === 'cancelled')) {
      retried = true;
      succeededAtCancel = null;
      succeededAtRetry = new Set(await succeededSteps());
      startsAtRetry = new Map(o.starts);
      expect((await retryRun(db.pool, run.id, { now })).retried).toBe(true);
      continue;
    }
    break;
  }

  // Recovery recounts what spawns listed; a last pass with recovery settles it.
  await tick(db.pool, { tasks: [prop], now: roundTime(61) });
  await checkRows(o, 'the end');
  const [final] = await db.rows<{ state: string; failed_task_id: string | null; error: string | null }>(
    `SELECT state::text, failed_task_id::text, error FROM outlive.runs WHERE id = $1`,
    [run.id],
  );
  const rows = await db.rows<{ id: string; step: string; state: string; finished_at: Date | null; attempts: number; errors: { attempt: number; message: string }[] }>(
    `SELECT id::text, step, state::text, finished_at, attempts, errors FROM outlive.tasks WHERE run_id = $1`,
    [run.id],
  );
  // What each row went through, for the message of a failed comparison.
  const story = rows.map((t) => `${t.step}: ${t.state} after ${t.attempts} attempt(s), starts ${o.starts.get(t.step) ?? 0}; ${t.errors.map((e) => `#${e.attempt} ${e.message}`).join(' | ')}`).join('\n');
  expect(final!.state, 'the run finished').not.toBe('running');
  const actual = Object.fromEntries(rows.map((t) => [t.step, t.state]));
  if (succeededAtCancel) {
    expect(final!.state).toBe('cancelled');
    for (const t of rows) expect(FINAL.has(t.state), `${t.step} is ${t.state} after the cancel`).toBe(true);
    return;
  }
  // No cancel standing since the last retry: the model says what every step ends as.
  const m = model(scn, retried ? succeededAtRetry : new Set(), retried ? startsAtRetry : new Map());
  expect(actual, `${retried ? 'retried; ' : ''}rows:\n${story}`).toEqual(Object.fromEntries([...m.states].map(([k, v]) => [k, v])));
  const failed = rows.filter((t) => t.state === 'failed');
  if (failed.length === 0) {
    expect(final!.state).toBe('succeeded');
    return;
  }
  expect(final!.state).toBe('failed');
  // Named after its first failure.
  const named = rows.find((t) => t.id === final!.failed_task_id);
  expect(named?.state, 'the run names a failed task').toBe('failed');
  for (const f of failed) expect(new Date(f.finished_at!).getTime()).toBeGreaterThanOrEqual(new Date(named!.finished_at!).getTime());
  expect(final!.error).toContain(`"${named!.step}"`);
}

describe('runs, against a model of their rules', () => {
  const numRuns = Number(process.env.OUTLIVE_PROPERTY_RUNS ?? 100);
  const seed = Number(process.env.OUTLIVE_PROPERTY_SEED ?? Date.now() % 2_147_483_647);

  it(`random graphs, spawns, outcomes, passes, cancels and retries (${numRuns} runs, seed ${seed})`, { timeout: Math.max(60_000, numRuns * 10_000) }, async () => {
    console.log(`runs property: seed ${seed}, ${numRuns} runs (replay: OUTLIVE_PROPERTY_SEED=${seed} npx vitest run test/runs.property.test.ts)`);
    const path = process.env.OUTLIVE_PROPERTY_PATH;
    await fc.assert(fc.asyncProperty(scenarioArb, play), { numRuns, seed, ...(path ? { path } : {}) });
  });
});
