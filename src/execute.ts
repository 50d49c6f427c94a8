/**
 * Execute: run one claimed task's handler and turn whatever happens into an
 * outcome to settle. Nothing a handler does (throw a non-Error, hang past its
 * timeout, return something that is not JSON) escapes from here.
 */
import { backoffDelay } from './backoff.js';
import type { ClaimedTask } from './claim.js';
import { NonRetriableError, RetryAfterError, toError } from './errors.js';
import { utf8Bytes } from './json.js';
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
export type Outcome =
  | { id: string; state: 'succeeded'; output: string | null }
  | { id: string; state: 'pending'; retryAt: Date | null; delayMs: number; error: ErrorEntry }
  | { id: string; state: 'failed'; error: ErrorEntry };

/** The error a handler's signal carries when its timeout fires. */
export class TaskTimeoutError extends Error {
  constructor(ms: number) {
    super(`timed out after ${ms} ms`);
    this.name = 'TaskTimeoutError';
  }
}

function entry(err: Error, attempt: number): ErrorEntry {
  const e: ErrorEntry = {
    attempt,
    at: new Date().toISOString(),
    name: err.name || 'Error',
    message: String(err.message).slice(0, 4_000),
  };
  if (err.stack) e.stack = err.stack.slice(0, 8_000);
  return e;
}

/** The outcome of a failed attempt: retry with backoff, retry at a given time, or fail for good. */
export function failure(task: AnyTask | undefined, claimed: ClaimedTask, thrown: unknown): Outcome {
  const err = toError(thrown);
  const error = entry(err, claimed.attempts);
  const exhausted = claimed.attempts >= claimed.max_attempts;
  if (err instanceof NonRetriableError || exhausted || !task) return { id: claimed.id, state: 'failed', error };
  if (err instanceof RetryAfterError) {
    return { id: claimed.id, state: 'pending', retryAt: err.retryAt ?? null, delayMs: err.delayMs ?? 0, error };
  }
  return { id: claimed.id, state: 'pending', retryAt: null, delayMs: backoffDelay(task.backoff, claimed.attempts), error };
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
  return json;
}

/**
 * Runs one claimed task. `abort` (the pass's or the run's) and the task's
 * own timeout both fire the handler's signal. Resolves with the outcome; it
 * never rejects.
 */
export async function execute(
  task: AnyTask | undefined,
  claimed: ClaimedTask,
  extra: { signal?: AbortSignal; context?: Partial<TaskContext> } = {},
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

  const controller = new AbortController();
  const onOuterAbort = () => controller.abort(extra.signal?.reason);
  if (extra.signal?.aborted) onOuterAbort();
  else extra.signal?.addEventListener('abort', onOuterAbort, { once: true });

  let timer: ReturnType<typeof setTimeout> | undefined;
  const aborted = new Promise<never>((_, reject) => {
    const onAbort = () => reject(controller.signal.reason ?? new Error('aborted'));
    if (controller.signal.aborted) onAbort();
    else controller.signal.addEventListener('abort', onAbort, { once: true });
  });
  aborted.catch(() => undefined);
  timer = setTimeout(() => controller.abort(new TaskTimeoutError(claimed.timeout_ms)), claimed.timeout_ms);

  const ctx: TaskContext = {
    taskId: claimed.id,
    attempt: claimed.attempts,
    maxAttempts: claimed.max_attempts,
    queue: claimed.queue,
    runId: claimed.run_id,
    signal: controller.signal,
    ...extra.context,
  };
  try {
    // A handler that ignores its signal is abandoned here at its timeout:
    // the race settles the task, and whatever it returns later is dropped.
    const value = await Promise.race([Promise.resolve().then(() => task.run(parsed.data, ctx)), aborted]);
    return { id: claimed.id, state: 'succeeded', output: serialiseOutput(value) };
  } catch (thrown) {
    return failure(task, claimed, thrown);
  } finally {
    clearTimeout(timer);
    extra.signal?.removeEventListener('abort', onOuterAbort);
  }
}
