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

/** Longest a task may snooze at once: a day. */
export const MAX_SNOOZE_MS = 86_400_000;

/**
 * "Not yet" (thrown by a handler, or by `ctx.snooze`): the task goes back to
 * pending for `after` ms, or until a time, without spending an attempt.
 *
 * ```ts
 * if (job.status === 'in_progress') throw new SnoozeError(30_000);
 * ```
 */
export class SnoozeError extends Error {
  readonly retryAt: Date | undefined;
  readonly delayMs: number | undefined;
  constructor(after: number | Date, message?: string) {
    if (after instanceof Date ? Number.isNaN(after.getTime()) : typeof after !== 'number' || !Number.isFinite(after) || after < 0 || after > MAX_SNOOZE_MS) {
      throw new TypeError(`SnoozeError: give a delay in milliseconds from 0 to ${MAX_SNOOZE_MS}, or a valid Date; got ${String(after)}`);
    }
    super(message ?? (after instanceof Date ? `snoozed until ${after.toISOString()}` : `snoozed for ${after} ms`));
    this.name = 'SnoozeError';
    if (after instanceof Date) this.retryAt = after;
    else this.delayMs = after;
  }
}

/**
 * Thrown by a handler when a provider refused the call for its rate limit
 * (an HTTP 429): the key is paused for every pass until `retryAfterMs` from
 * now, and the task goes back to pending without spending an attempt.
 *
 * ```ts
 * if (res.status === 429) throw new RateLimitedError({ key: 'openai', retryAfterMs: retryAfter(res) });
 * ```
 */
export class RateLimitedError extends Error {
  readonly key: string;
  readonly retryAfterMs: number;
  constructor({ key, retryAfterMs, message }: { key: string; retryAfterMs: number; message?: string }) {
    super(message ?? `rate limited on key "${key}": retry after ${retryAfterMs} ms`);
    this.name = 'RateLimitedError';
    if (typeof key !== 'string' || key.length === 0 || key.length > 500) throw new TypeError('RateLimitedError: key must be a non-empty string of at most 500 characters');
    if (typeof retryAfterMs !== 'number' || !Number.isFinite(retryAfterMs) || retryAfterMs < 0) {
      throw new TypeError(`RateLimitedError: retryAfterMs must be a finite number of milliseconds >= 0, got ${String(retryAfterMs)}`);
    }
    this.key = key;
    this.retryAfterMs = Math.min(retryAfterMs, 86_400_000);
  }
}

/** The most of a plain object's JSON an error message carries. */
const MAX_THROWN_JSON = 500;

/**
 * Turns anything thrown into an Error, so every catch deals in one type, and
 * keeps what says what happened: an Event's message (the Neon driver throws
 * an `ErrorEvent` on Node 22+, whose message is on its prototype, so its
 * JSON is `{}`), a driver's `code`, a plain object's JSON (bounded). An
 * object that is not plain data (a driver's client, an event) is never
 * written out: its fields may hold the backend's cancel key or a password.
 */
export function toError(thrown: unknown): Error {
  if (thrown instanceof Error) return thrown;
  if (typeof thrown === 'string') return new Error(thrown);
  if (thrown === null || typeof thrown !== 'object') return new Error(`non-Error thrown: ${String(thrown)}`);
  const o = thrown as { message?: unknown; error?: unknown; code?: unknown };
  const kind = kindOf(thrown);
  const cause = o.error instanceof Error ? o.error : undefined;
  const message = typeof o.message === 'string' && o.message !== '' ? o.message : cause?.message;
  if (message) {
    const err = new Error(kind ? `${kind}: ${message}` : message, cause ? { cause } : undefined);
    if (typeof o.code === 'string' || typeof o.code === 'number') Object.assign(err, { code: o.code });
    return err;
  }
  if (kind) return new Error(`non-Error thrown: ${/^[aeiou]/i.test(kind) ? 'an' : 'a'} ${kind}`);
  let text: string;
  try {
    text = JSON.stringify(thrown) ?? String(thrown);
  } catch {
    text = String(thrown);
  }
  if (text.length > MAX_THROWN_JSON) text = `${text.slice(0, MAX_THROWN_JSON)}…`;
  return new Error(`non-Error thrown: ${text}`);
}

/** The class name of an object that is not plain data, or undefined for a plain object. */
function kindOf(value: object): string | undefined {
  const proto = Object.getPrototypeOf(value) as { constructor?: { name?: unknown } } | null;
  if (proto === null || proto === Object.prototype) return undefined;
  const name = proto.constructor?.name;
  return typeof name === 'string' && name !== '' ? name : 'object';
}
