/**
 * Execute: run one claimed task's handler and turn whatever happens into an
 * outcome to settle. Nothing a handler does (throw a non-Error, hang past its
 * timeout, return something that is not JSON) escapes from here.
 */
import { formatIssues } from '../model/checks.js';
import { backoffDelay } from '../model/backoff.js';
import type { ClaimedTask } from './claim.js';
import { InvalidGraphError, NonRetriableError, RateLimitedError, RetryAfterError, SnoozeError, toError } from '../model/errors.js';
import { MAX_OUTPUT_BYTES, storableJson, storableText } from '../model/json.js';
import type { Executor } from '../db/executor.js';
import { checkGraph } from '../model/graph.js';
import { MAX_STEPS_PER_WRITE, prepareStep, type PreparedStep, type Step } from '../model/step.js';
import { MAX_SNOOZES, type AnyTask, type Progress, type TaskContext } from '../model/task.js';
import { isThenable, validate, type Validation } from '../model/input-schema.js';

export { MAX_OUTPUT_BYTES };

/** One attempt's error as kept in the row's history. */
export interface ErrorEntry {
  attempt: number;
  at: string;
  name: string;
  message: string;
  stack?: string;
}

/** What a settle writes for one task. */
export type Outcome = {
  id: string;
  runId: string | null;
  /** The attempt it is the outcome of (the claim counted it): the settle matches only that attempt. */
  attempt: number;
  /** A task with flow control: its settle gives back its slots (src/pass/settle.ts). */
  governed?: true;
  /** What its slot release applies: reported costs and a 429's pause, as JSON (outlive.release_slots). */
  flow?: string | null;
} & (
  | {
      state: 'succeeded';
      output: string | null;
      spawns?: PreparedStep[];
      /** Delete the row rather than keep it as history (a standalone task defined with keepSucceeded: false). */
      drop?: true;
    }
  | { state: 'pending'; retryAt: Date | null; delayMs: number; error: ErrorEntry }
  /** Not yet (SnoozeError): pending again after the delay, the attempt not spent; `error` is written only if it snoozed too often. */
  | { state: 'snoozed'; retryAt: Date | null; delayMs: number; error: ErrorEntry }
  | { state: 'failed'; error: ErrorEntry }
  /** Handed back unfinished (the pass was shutting down): pending again at once, the attempt not counted. */
  | { state: 'released' }
);

/**
 * The reason a pass gives when it aborts its running handlers to shut down.
 * An attempt aborted with it is handed back, not counted as a failure.
 */
export class HandBackError extends Error {
  constructor(message = 'the pass is shutting down; the task is handed back to run again') {
    super(message);
    this.name = 'HandBackError';
  }
}

/** The error a handler's signal carries when its timeout fires. */
export class TaskTimeoutError extends Error {
  constructor(ms: number) {
    super(`timed out after ${ms} ms`);
    this.name = 'TaskTimeoutError';
  }
}

/** One attempt's error as the row keeps it. */
export function entry(err: Error, attempt: number): ErrorEntry {
  const e: ErrorEntry = {
    attempt,
    at: new Date().toISOString(),
    name: err.name || 'Error',
    message: storableText(String(err.message).slice(0, 4_000)),
  };
  if (err.stack) e.stack = storableText(err.stack.slice(0, 8_000));
  return e;
}

/**
 * The outcome of a task a pass hands back unstarted (its budget ran out, it
 * was told to stop): pending again at once, the attempt not counted, and its
 * slots and rate starts given back.
 */
export function handedBack(claimed: ClaimedTask): Outcome {
  return { ...baseOf(claimed, { costs: { '*': 0 } }), state: 'released' };
}

/** What every outcome of a claimed task starts from: the one place that says whether its settle gives back slots. */
function baseOf(claimed: ClaimedTask, flow: FlowReport | null = null): { id: string; runId: string | null; attempt: number; governed?: true; flow?: string | null } {
  const base = { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts };
  const json = flow && (flow.costs || flow.pause) ? JSON.stringify(flow) : null;
  if (claimed.fair_key == null) return json && flow?.pause ? { ...base, flow: json } : base;
  return { ...base, governed: true, flow: json };
}

/** What a governed attempt tells its slot release. */
interface FlowReport {
  costs?: Record<string, number>;
  pause?: { key: string; ms: number; reason: string };
}

/** The outcome of a failed attempt: retry with backoff, retry at a given time, or fail for good. */
export function failure(task: AnyTask | undefined, claimed: ClaimedTask, thrown: unknown, flow: FlowReport = {}): Outcome {
  const err = toError(thrown);
  const error = entry(err, claimed.attempts);
  const base = baseOf(claimed, flow);
  const exhausted = claimed.attempts >= claimed.max_attempts;
  if (err instanceof RateLimitedError && task) {
    // The provider refused the start: the key pauses for everyone. A task
    // that holds the key waits for it without spending an attempt; one that
    // does not (no claim of it checks the key) retries after the pause.
    const paused = baseOf(claimed, { ...flow, pause: { key: err.key, ms: err.retryAfterMs, reason: err.message } });
    if (claimed.limits?.some((l) => l.k === err.key)) return { ...paused, state: 'released' };
    if (!exhausted) return { ...paused, state: 'pending', retryAt: null, delayMs: err.retryAfterMs, error };
  }
  if (err instanceof SnoozeError && task) {
    // The error is what the row keeps if this snooze is one too many (the settle decides, on the row's count).
    const over = entry(Object.assign(new Error(`snoozed more than ${MAX_SNOOZES} times (the last: ${err.message})`), { name: 'SnoozeError' }), claimed.attempts);
    return { ...base, state: 'snoozed', retryAt: err.retryAt ?? null, delayMs: err.delayMs ?? 0, error: over };
  }
  if (err instanceof NonRetriableError || exhausted || !task) return { ...base, state: 'failed', error };
  if (err instanceof RetryAfterError) {
    return { ...base, state: 'pending', retryAt: err.retryAt ?? null, delayMs: err.delayMs ?? 0, error };
  }
  return { ...base, state: 'pending', retryAt: null, delayMs: backoffDelay(task.backoff, claimed.attempts), error };
}

function serialiseOutput(value: unknown): string | null {
  if (value === undefined) return null;
  const stored = storableJson(value, MAX_OUTPUT_BYTES);
  if (stored.why !== undefined) throw new NonRetriableError(`output ${stored.why}`);
  return stored.json ?? null;
}

/** Progress is written at most this often per attempt. */
const PROGRESS_EVERY_MS = 1_000;
/** Longest progress note. */
const MAX_NOTE = 500;

// Only the attempt that holds the row writes its progress: the attempt, and
// the pass's owner where the pass gave it.
const PROGRESS_SQL = `
UPDATE outlive.tasks SET progress = $4::jsonb OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('at', pg_catalog.now())
WHERE id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'running' AND attempts OPERATOR(pg_catalog.=) $2
  AND ($3::text IS NULL OR lease_owner OPERATOR(pg_catalog.=) $3::text)`;

/** Checks what a handler gives ctx.progress; a clear TypeError for anything else. */
function progressJson(p: Progress, where: string): string {
  const bad = (m: string): never => {
    throw new TypeError(`outlive: ${where}: ctx.progress ${m}`);
  };
  if (!p || typeof p !== 'object' || Array.isArray(p)) bad('takes { done?, total?, note? }');
  const unknown = Object.keys(p).filter((k) => !['done', 'total', 'note'].includes(k));
  if (unknown.length) bad(`has unknown field(s) ${unknown.join(', ')}: use done, total, note`);
  for (const k of ['done', 'total'] as const) {
    const v = p[k];
    if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v < 0)) bad(`${k} must be a finite number >= 0, got ${String(v)}`);
  }
  if (p.note !== undefined && (typeof p.note !== 'string' || p.note.length > MAX_NOTE)) bad(`note must be a string of at most ${MAX_NOTE} characters`);
  const out: Progress = {};
  if (p.done !== undefined) out.done = p.done;
  if (p.total !== undefined) out.total = p.total;
  if (p.note !== undefined) out.note = storableText(p.note);
  return JSON.stringify(out);
}

/** Extends one attempt's lease; resolves false when the row is no longer the pass's. */
export type Heartbeat = (claimed: ClaimedTask, attempt: AttemptAbort) => Promise<boolean>;

/**
 * Runs one claimed task. `attempt` (aborted by the pass) and the task's own
 * timeout both fire the handler's signal. Resolves with the outcome; it
 * never rejects.
 *
 * A handler that returns without awaiting (a no-op, a pure computation) is
 * settled straight from its return value: no timer, no race, no promise of
 * ours. Measured in a CPU profile of a pass draining 100,000 no-op tasks,
 * the per-task timer, race and context closures were a third of the
 * process's own time and most of its garbage.
 */
export async function execute(
  task: AnyTask | undefined,
  claimed: ClaimedTask,
  extra: { attempt?: AttemptAbort; db?: Executor; heartbeat?: Heartbeat; owner?: string } = {},
): Promise<Outcome> {
  if (!task) {
    return failure(undefined, claimed, new NonRetriableError(
      `unknown task "${claimed.name}": no task with this name was given to the pass that claimed it`,
    ));
  }
  let parsed: Validation;
  try {
    // A synchronous schema (the common case) costs no promise here; an
    // asynchronous one, which enqueue refuses, is awaited all the same.
    const result = validate(task.input, claimed.input);
    parsed = isThenable(result) ? await result : result;
  } catch (thrown) {
    // A schema that throws (an async check that could not reach its
    // service) failed this attempt, not the input: it retries.
    return failure(task, claimed, thrown);
  }
  if (parsed.issues) {
    return failure(task, claimed, new NonRetriableError(`stored input does not match the schema of "${task.name}": ${formatIssues(parsed.issues)}`));
  }

  const abort = extra.attempt ?? new AttemptAbort();
  const started = performance.now();
  const ctx = new RunContext(claimed, abort, extra.db, extra.heartbeat, extra.owner);
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    if (abort.aborted) throw abort.reason;
    let value = task.run(parsed.value, ctx);
    if (isThenable(value)) {
      // A handler that ignores its signal is abandoned here at its timeout:
      // the race settles the task, and whatever it returns later is dropped.
      const left = Math.max(0, claimed.timeout_ms - (performance.now() - started));
      timer = setTimeout(() => abort.abort(new TaskTimeoutError(claimed.timeout_ms)), left);
      value = await Promise.race([value, abort.race()]);
    }
    const output = serialiseOutput(value);
    const spawns = ctx.spawns;
    const base = baseOf(claimed, ctx.flow);
    if (spawns) {
      checkSpawns(claimed, spawns);
      return { ...base, state: 'succeeded', output, spawns };
    }
    // A governed row is kept: its settle gives back its slots by updating it.
    if (!task.keepSucceeded && claimed.run_id === null && !base.governed) return { ...base, state: 'succeeded', output, drop: true };
    return { ...base, state: 'succeeded', output };
  } catch (thrown) {
    // Handed back unstarted: its rate starts are given back too (cost 0).
    if (abort.reason instanceof HandBackError) return handedBack(claimed);
    return failure(task, claimed, thrown, ctx.flow);
  } finally {
    if (timer !== undefined) clearTimeout(timer);
    ctx.end();
  }
}

/**
 * How one attempt is aborted (its timeout, a pass shutting down, a lost
 * lease). The handler's AbortSignal is made only when the handler reads
 * `ctx.signal`: an AbortController per task was the largest single cost of a
 * pass of short tasks in a CPU profile (5% of the process's time, plus its
 * share of the garbage collector's 10%).
 */
export class AttemptAbort {
  private controller: AbortController | undefined;
  private rejectRace: ((reason: unknown) => void) | undefined;
  /** Why it was aborted, once it was. */
  reason: unknown = undefined;
  aborted = false;

  /** Aborts the attempt: fires its signal (if made) and ends its race. */
  abort(reason: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.controller?.abort(reason);
    this.rejectRace?.(reason);
  }

  /** The handler's signal, made on first use. */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }

  /** A promise that rejects with the reason when the attempt is aborted. */
  race(): Promise<never> {
    const p = new Promise<never>((_, reject) => {
      if (this.aborted) reject(this.reason);
      else this.rejectRace = reject;
    });
    p.catch(() => undefined);
    return p;
  }
}

/**
 * Checks the graph of one attempt's spawns once, after the handler returned
 * (checking on every spawn would cost O(n^2) for a 10,000-page fan-out).
 * Steps already in the run cannot wait for new ones, so a cycle can only run
 * through this attempt's spawns; names outside them are checked to exist when
 * the spawns are written. A bad graph will not get better on retry.
 */
function checkSpawns(claimed: ClaimedTask, spawns: readonly PreparedStep[]): void {
  const graph = new Map(spawns.map((s) => [s.step, s.after]));
  const external = new Set<string>();
  for (const after of graph.values()) for (const dep of after) if (!graph.has(dep)) external.add(dep);
  try {
    checkGraph(`task ${claimed.id} ("${claimed.name}") spawning`, graph, external);
  } catch (err) {
    throw new NonRetriableError((err as Error).message, { cause: err });
  }
}

const OUTPUT_OF_SQL = `
SELECT output FROM outlive.tasks
WHERE run_id OPERATOR(pg_catalog.=) $1 AND step OPERATOR(pg_catalog.=) $2 AND state OPERATOR(pg_catalog.=) 'succeeded'`;
const DEPENDENCY_OUTPUTS_SQL = `
SELECT p.step, p.output FROM outlive.task_deps d JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
WHERE d.task_id OPERATOR(pg_catalog.=) $1 AND p.state OPERATOR(pg_catalog.=) 'succeeded'`;

/**
 * What a handler sees of its attempt. A class, not an object of closures:
 * one allocation per task, and the rest (the signal, the spawn list, the
 * name used in errors) made only when a handler asks. Its methods are
 * getters handing out functions bound once, on first use, so a handler may
 * destructure them (`async (input, { spawn, signal }) => ...`).
 */
class RunContext implements TaskContext {
  readonly taskId: string;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly queue: string;
  readonly runId: string | null;
  /** What this attempt spawned, once it spawned something. */
  spawns: PreparedStep[] | undefined = undefined;
  /** The costs it reported, for its slot release. */
  flow: FlowReport = {};
  private spawned: Set<string> | undefined = undefined;

  constructor(
    private readonly claimed: ClaimedTask,
    private readonly abort: AttemptAbort,
    private readonly db: Executor | undefined,
    private readonly beat: Heartbeat | undefined,
    private readonly owner: string | undefined,
  ) {
    this.taskId = claimed.id;
    this.attempt = claimed.attempts;
    this.maxAttempts = claimed.max_attempts;
    this.queue = claimed.queue;
    this.runId = claimed.run_id;
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  private bound: Partial<Pick<TaskContext, 'heartbeat' | 'spawn' | 'output' | 'outputs' | 'reportCost' | 'progress'>> | undefined = undefined;

  snooze(after: number | Date): never {
    throw new SnoozeError(after);
  }

  /** When progress was last written, and what waits to be written once the second is up. */
  private progressAt = -Infinity;
  private progressLater: { json: string; timer: ReturnType<typeof setTimeout> } | undefined = undefined;

  get progress(): TaskContext['progress'] {
    return ((this.bound ??= {}).progress ??= this.reportProgress.bind(this));
  }

  private reportProgress(progress: Progress): Promise<void> {
    const json = progressJson(progress, this.where);
    const wait = this.progressAt + PROGRESS_EVERY_MS - performance.now();
    if (wait <= 0) return this.writeProgress(json);
    if (this.progressLater) this.progressLater.json = json;
    else {
      const timer = setTimeout(() => {
        const later = this.progressLater;
        this.progressLater = undefined;
        if (later) void this.writeProgress(later.json);
      }, wait);
      timer.unref?.();
      this.progressLater = { json, timer };
    }
    return Promise.resolve();
  }

  private async writeProgress(json: string): Promise<void> {
    this.progressAt = performance.now();
    if (!this.db || this.abort.aborted) return;
    try {
      await this.db.query(PROGRESS_SQL, [this.claimed.id, this.claimed.attempts, this.owner ?? null, json]);
    } catch {
      // Progress is for the operator's eyes: a write it loses must not fail the attempt.
    }
  }

  /** The attempt is over: a progress still waiting for its second is dropped (the outcome says more). */
  end(): void {
    if (this.progressLater) clearTimeout(this.progressLater.timer);
    this.progressLater = undefined;
  }

  get reportCost(): TaskContext['reportCost'] {
    return ((this.bound ??= {}).reportCost ??= this.recordCost.bind(this));
  }

  private recordCost(actual: number, key?: string): void {
    if (typeof actual !== 'number' || !Number.isFinite(actual) || actual < 0) {
      throw new TypeError(`outlive: ${this.where}: reportCost takes a finite number >= 0, got ${String(actual)}`);
    }
    const rated = (this.claimed.limits ?? []).filter((l) => l.r !== undefined);
    if (key !== undefined && !rated.some((l) => l.k === key)) {
      throw new TypeError(`outlive: ${this.where}: reportCost for key "${key}", which is not a rate limit of this task (${rated.map((l) => `"${l.k}"`).join(', ') || 'it has none'})`);
    }
    const costs = (this.flow.costs ??= {});
    for (const l of rated) if (key === undefined || l.k === key) costs[l.k] = actual;
  }

  get heartbeat(): TaskContext['heartbeat'] {
    return ((this.bound ??= {}).heartbeat ??= this.beatNow.bind(this));
  }

  get spawn(): TaskContext['spawn'] {
    return ((this.bound ??= {}).spawn ??= this.addStep.bind(this));
  }

  get output(): TaskContext['output'] {
    return ((this.bound ??= {}).output ??= this.outputOf.bind(this) as TaskContext['output']);
  }

  get outputs(): TaskContext['outputs'] {
    return ((this.bound ??= {}).outputs ??= this.dependencyOutputs.bind(this));
  }

  private beatNow(): Promise<boolean> {
    return this.beat ? this.beat(this.claimed, this.abort) : Promise.resolve(!this.abort.aborted);
  }

  private addStep(name: string, spec: Step): void {
    this.needRun('spawn');
    const spawns = (this.spawns ??= []);
    const spawned = (this.spawned ??= new Set());
    if (spawns.length >= MAX_STEPS_PER_WRITE) {
      throw new InvalidGraphError(`outlive: ${this.where}: a task may spawn at most ${MAX_STEPS_PER_WRITE} steps`);
    }
    const prepared = prepareStep(`${this.where} spawning`, name, spec);
    if (spawned.has(prepared.step)) throw new InvalidGraphError(`outlive: ${this.where}: spawned step "${name}" twice`);
    spawned.add(prepared.step);
    spawns.push(prepared);
  }

  private async outputOf(stepName: string): Promise<unknown> {
    const { runId, db } = this.needRun('output');
    const rows = await db.query<{ output: unknown }>(OUTPUT_OF_SQL, [runId, stepName]);
    if (rows.length === 0) throw new InvalidGraphError(`outlive: ${this.where}: step "${stepName}" has not succeeded in run ${runId}`);
    return rows[0]!.output ?? undefined;
  }

  private async dependencyOutputs(): Promise<Record<string, unknown>> {
    const { db } = this.needRun('outputs');
    const rows = await db.query<{ step: string; output: unknown }>(DEPENDENCY_OUTPUTS_SQL, [this.claimed.id]);
    return Object.fromEntries(rows.map((r) => [r.step, r.output ?? undefined]));
  }

  private get where(): string {
    return `task ${this.claimed.id} ("${this.claimed.name}")`;
  }

  private needRun(what: string): { runId: string; db: Executor } {
    if (!this.claimed.run_id) throw new InvalidGraphError(`outlive: ${this.where}: ${what} needs a task that belongs to a run`);
    if (!this.db) throw new Error(`outlive: ${this.where}: ${what} needs the database of the pass`);
    return { runId: this.claimed.run_id, db: this.db };
  }
}
