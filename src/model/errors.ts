/**
 * Errors outlive throws at its callers, and the control-flow errors a task
 * handler throws to steer its own retries.
 */

/** Base class of every error outlive throws at its callers. */
export class OutliveError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Enqueue was refused: the input failed the task's schema, or an option is out of range. Nothing was written. */
export class InvalidEnqueueError extends OutliveError {}

/** A task name that no definition in this process matches. */
export class UnknownTaskError extends OutliveError {}

/** A run's graph is malformed (cycle, dangling dependency, duplicate or missing steps). Nothing was written. */
export class InvalidGraphError extends OutliveError {}

/** Configuration that cannot work, named with the fix. */
export class ConfigError extends OutliveError {}

/**
 * Thrown by a handler to fail the task at once, without using its remaining
 * attempts: for errors that no retry can fix (a 404, a malformed document).
 */
export class NonRetriableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'NonRetriableError';
  }
}

/**
 * Thrown by a handler to be retried after the given delay (milliseconds) or at
 * the given time, instead of after the task's backoff: for a rate limit's
 * Retry-After. It still counts as an attempt.
 */
export class RetryAfterError extends Error {
  readonly retryAt: Date | undefined;
  readonly delayMs: number | undefined;
  constructor(message: string, after: number | Date, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'RetryAfterError';
    if (after instanceof Date) this.retryAt = after;
    else this.delayMs = Math.max(0, after);
  }
}

/** Turns anything thrown into an Error, so every catch deals in one type. */
export function toError(thrown: unknown): Error {
  if (thrown instanceof Error) return thrown;
  if (typeof thrown === 'string') return new Error(thrown);
  let text: string;
  try {
    text = JSON.stringify(thrown) ?? String(thrown);
  } catch {
    text = String(thrown);
  }
  return new Error(`non-Error thrown: ${text}`);
}
