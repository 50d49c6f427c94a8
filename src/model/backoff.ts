/**
 * How long a task waits before its next attempt.
 */

/** Exponential backoff: `baseMs * factor^(attempt-1)`, capped at `maxMs`, with jitter. */
export interface BackoffOptions {
  /** Delay after the first failed attempt. Default 1 s. */
  baseMs?: number;
  /** Growth per attempt. Default 2. */
  factor?: number;
  /** Longest delay. Default 1 h. */
  maxMs?: number;
  /**
   * `equal` (default) waits between half and all of the delay, `full` between
   * none and all of it, `none` exactly the delay. Jitter spreads out retries
   * of tasks that failed together, so they do not stampede a recovering service.
   */
  jitter?: 'equal' | 'full' | 'none';
}

/** The delay in milliseconds after failed attempt number `attempt` (from 1). */
export function backoffDelay(
  policy: BackoffOptions | ((attempt: number) => number),
  attempt: number,
  random: () => number = Math.random,
): number {
  if (typeof policy === 'function') {
    const ms = policy(attempt);
    return Number.isFinite(ms) && ms > 0 ? ms : 0;
  }
  const base = policy.baseMs ?? 1_000;
  const factor = policy.factor ?? 2;
  const max = policy.maxMs ?? 3_600_000;
  const delay = Math.min(max, base * Math.pow(factor, Math.max(0, attempt - 1)));
  switch (policy.jitter ?? 'equal') {
    case 'none':
      return delay;
    case 'full':
      return random() * delay;
    default:
      return delay / 2 + (random() * delay) / 2;
  }
}
