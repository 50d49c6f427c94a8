/**
 * Execute: run one claimed task's handler and turn whatever happens into an
 * outcome to settle. Nothing a handler does (throw a non-Error, hang past its
 * timeout, return something that is not JSON) escapes from here.
 */
import { formatIssues } from '../model/checks.js';
import { backoffDelay } from '../model/backoff.js';
import type { ClaimedTask } from './claim.js';
import { InvalidGraphError, NonRetriableError, RetryAfterError, toError } from '../model/errors.js';
import { storableText, unstorableJson, utf8Bytes } from '../model/json.js';
import type { Executor } from '../db/executor.js';
import { checkGraph } from '../model/graph.js';
import { MAX_STEPS_PER_WRITE, prepareStep, type PreparedStep, type Step } from '../model/step.js';
import type { AnyTask, TaskContext } from '../model/task.js';
import { isThenable, validate, type Validation } from '../model/input-schema.js';

/** Largest serialised output a task may store: 1 MiB. */
export const MAX_OUTPUT_BYTES = 1_048_576;

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
} & (
  | {
      state: 'succeeded';
      output: string | null;
      spawns?: PreparedStep[];
      /** Delete the row rather than keep it as history (a standalone task defined with keepSucceeded: false). */
      drop?: true;
    }
  | { state: 'pending'; retryAt: Date | null; delayMs: number; error: ErrorEntry }
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

/** The outcome of a failed attempt: retry with backoff, retry at a given time, or fail for good. */
export function failure(task: AnyTask | undefined, claimed: ClaimedTask, thrown: unknown): Outcome {
  const err = toError(thrown);
  const error = entry(err, claimed.attempts);
  const base = { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts };
  const exhausted = claimed.attempts >= claimed.max_attempts;
  if (err instanceof NonRetriableError || exhausted || !task) return { ...base, state: 'failed', error };
  if (err instanceof RetryAfterError) {
    return { ...base, state: 'pending', retryAt: err.retryAt ?? null, delayMs: err.delayMs ?? 0, error };
  }
  return { ...base, state: 'pending', retryAt: null, delayMs: backoffDelay(task.backoff, claimed.attempts), error };
}

function serialiseOutput(value: unknown): string | null {
  if (value === undefined) return null;
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    throw new NonRetriableError(`output does not serialise to JSON (${toError(err).message})`);
  }
  if (json === undefined) return null;
  const bytes = utf8Bytes(json, MAX_OUTPUT_BYTES);
  if (bytes > MAX_OUTPUT_BYTES) {
    throw new NonRetriableError(`output is ${bytes} bytes of JSON, over the limit of ${MAX_OUTPUT_BYTES}`);
  }
  const why = unstorableJson(json);
  if (why) throw new NonRetriableError(`output cannot be stored: ${why}`);
  return json;
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
  extra: { attempt?: AttemptAbort; db?: Executor; heartbeat?: Heartbeat } = {},
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
  const ctx = new RunContext(claimed, abort, extra.db, extra.heartbeat);
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
    if (spawns) {
      checkSpawns(claimed, spawns);
      return { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts, state: 'succeeded', output, spawns };
    }
    if (!task.keepSucceeded && claimed.run_id === null) return { id: claimed.id, runId: null, attempt: claimed.attempts, state: 'succeeded', output, drop: true };
    return { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts, state: 'succeeded', output };
  } catch (thrown) {
    if (abort.reason instanceof HandBackError) return { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts, state: 'released' };
    return failure(task, claimed, thrown);
  } finally {
    if (timer !== undefined) clearTimeout(timer);
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
  private spawned: Set<string> | undefined = undefined;

  constructor(
    private readonly claimed: ClaimedTask,
    private readonly abort: AttemptAbort,
    private readonly db: Executor | undefined,
    private readonly beat: Heartbeat | undefined,
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

  private bound: Partial<Pick<TaskContext, 'heartbeat' | 'spawn' | 'output' | 'outputs'>> | undefined = undefined;

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
