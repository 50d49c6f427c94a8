/**
 * Execute: run one claimed task's handler and turn whatever happens into an
 * outcome to settle. Nothing a handler does (throw a non-Error, hang past its
 * timeout, return something that is not JSON) escapes from here.
 */
import { backoffDelay } from './backoff.js';
import type { ClaimedTask } from './claim.js';
import { InvalidGraphError, NonRetriableError, RetryAfterError, toError } from './errors.js';
import { storableText, unstorableJson, utf8Bytes } from './json.js';
import type { Executor } from './executor.js';
import { checkGraph } from './graph.js';
import { MAX_STEPS_PER_WRITE, prepareStep, type PreparedStep, type Step } from './runs.js';
import type { AnyTask, TaskContext } from './task.js';

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
export type Outcome = { id: string; runId: string | null } & (
  | { state: 'succeeded'; output: string | null; spawns?: PreparedStep[] }
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
  const base = { id: claimed.id, runId: claimed.run_id };
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

/**
 * Runs one claimed task. `attempt` (aborted by the pass) and the task's own
 * timeout both fire the handler's signal. Resolves with the outcome; it
 * never rejects.
 */
export async function execute(
  task: AnyTask | undefined,
  claimed: ClaimedTask,
  extra: { attempt?: AttemptAbort; db?: Executor; heartbeat?: () => Promise<boolean> } = {},
): Promise<Outcome> {
  if (!task) {
    return failure(undefined, claimed, new NonRetriableError(
      `unknown task "${claimed.name}": no task with this name was given to the pass that claimed it`,
    ));
  }
  const parsed = await task.input.safeParseAsync(claimed.input);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i: { path: PropertyKey[]; message: string }) => `${i.path.map(String).join('.') || '(input)'}: ${i.message}`);
    return failure(task, claimed, new NonRetriableError(`stored input does not match the schema of "${task.name}": ${issues.join('; ')}`));
  }

  const abort = extra.attempt ?? new AttemptAbort();
  const aborted = abort.race();
  const timer = setTimeout(() => abort.abort(new TaskTimeoutError(claimed.timeout_ms)), claimed.timeout_ms);
  const spawns: PreparedStep[] = [];
  const ctx = runContext(claimed, abort, spawns, extra.db, extra.heartbeat);
  try {
    // A handler that ignores its signal is abandoned here at its timeout:
    // the race settles the task, and whatever it returns later is dropped.
    const value = await Promise.race([Promise.resolve().then(() => task.run(parsed.data, ctx)), aborted]);
    const output = serialiseOutput(value);
    if (spawns.length > 0) checkSpawns(claimed, spawns);
    return { id: claimed.id, runId: claimed.run_id, state: 'succeeded', output, ...(spawns.length ? { spawns } : {}) };
  } catch (thrown) {
    if (abort.reason instanceof HandBackError) return { id: claimed.id, runId: claimed.run_id, state: 'released' };
    return failure(task, claimed, thrown);
  } finally {
    clearTimeout(timer);
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

const OUTPUT_OF_SQL = `SELECT output FROM outlive.tasks WHERE run_id = $1 AND step = $2 AND state = 'succeeded'`;
const DEPENDENCY_OUTPUTS_SQL = `
SELECT p.step, p.output FROM outlive.task_deps d JOIN outlive.tasks p ON p.id = d.depends_on
WHERE d.task_id = $1 AND p.state = 'succeeded'`;

function runContext(
  claimed: ClaimedTask,
  abort: AttemptAbort,
  spawns: PreparedStep[],
  db: Executor | undefined,
  heartbeat: (() => Promise<boolean>) | undefined,
): TaskContext {
  const where = `task ${claimed.id} ("${claimed.name}")`;
  const spawned = new Set<string>();
  const needRun = (what: string) => {
    if (!claimed.run_id) throw new InvalidGraphError(`outlive: ${where}: ${what} needs a task that belongs to a run`);
    if (!db) throw new Error(`outlive: ${where}: ${what} needs the database of the pass`);
    return { runId: claimed.run_id, db };
  };
  return {
    taskId: claimed.id,
    attempt: claimed.attempts,
    maxAttempts: claimed.max_attempts,
    queue: claimed.queue,
    runId: claimed.run_id,
    get signal() {
      return abort.signal;
    },
    heartbeat: heartbeat ?? (async () => !abort.aborted),
    spawn(name: string, spec: Step) {
      needRun('spawn');
      if (spawns.length >= MAX_STEPS_PER_WRITE) {
        throw new InvalidGraphError(`outlive: ${where}: a task may spawn at most ${MAX_STEPS_PER_WRITE} steps`);
      }
      const prepared = prepareStep(`${where} spawning`, name, spec);
      if (spawned.has(prepared.step)) throw new InvalidGraphError(`outlive: ${where}: spawned step "${name}" twice`);
      spawned.add(prepared.step);
      spawns.push(prepared);
    },
    async output(stepName: string) {
      const { runId, db: exec } = needRun('output');
      const rows = await exec.query<{ output: unknown }>(OUTPUT_OF_SQL, [runId, stepName]);
      if (rows.length === 0) throw new InvalidGraphError(`outlive: ${where}: step "${stepName}" has not succeeded in run ${runId}`);
      return rows[0]!.output ?? undefined;
    },
    async outputs() {
      const { db: exec } = needRun('outputs');
      const rows = await exec.query<{ step: string; output: unknown }>(DEPENDENCY_OUTPUTS_SQL, [claimed.id]);
      return Object.fromEntries(rows.map((r) => [r.step, r.output ?? undefined]));
    },
  } as TaskContext;
}
