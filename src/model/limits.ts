/**
 * Flow control as a task declares it: limits on keys (concurrency, a rate
 * in any window, a cost per start) and a fairness key. Checked once at
 * defineTask, then turned, per input, into what the row keeps: its
 * fairness key and the limits of its keys (`tasks.fair_key`, `tasks.limits`).
 * The claim enforces them (migration 0014, `outlive.claim_governed`).
 */
import { ConfigError, InvalidEnqueueError } from './errors.js';
import { isWhole } from './checks.js';
import { storableText } from './json.js';

/** A key, fixed or computed from the input. */
export type KeyOf<I> = string | ((input: I) => string);

/**
 * One limit on a key. A task may name several keys, and one key may be named
 * by many tasks: the limit is the key's, shared by all of them.
 *
 * ```ts
 * limits: [
 *   { key: 'openai', concurrency: 5 },
 *   { key: 'openai', rate: { limit: 60, periodMs: 60_000 } },
 *   { key: 'openai-tokens', rate: { limit: 200_000, periodMs: 60_000 }, cost: (i) => i.estTokens },
 *   { key: (i) => `import:${i.customerId}`, concurrency: 1 },
 * ]
 * ```
 */
export interface Limit<I = unknown> {
  key: KeyOf<I>;
  /** At most this many tasks of the key running at once, across every pass. */
  concurrency?: number;
  /** At most `limit` starts (or units of cost) in any window of `periodMs`. */
  rate?: Rate;
  /** What one start counts against `rate` (default 1); correct it at settle with `ctx.reportCost`. */
  cost?: number | ((input: I) => number);
}

/** A rate: at most `limit` starts (or units of cost) in any window of `periodMs`. */
export interface Rate {
  limit: number;
  periodMs: number;
  /**
   * At most this much cost starts back to back; the rest is spread out, one
   * `periodMs / limit` per unit of cost apart. Default: `limit` (the window's
   * whole allowance may start at once). `burst: 1` starts a 60-a-minute rate
   * once a second, as providers that enforce a minute's limit per second expect.
   */
  burst?: number;
}

/** Round-robin between the fairness keys of a queue's ready tasks (weighted with `setWeight`). */
export interface Fairness<I = unknown> {
  key: KeyOf<I>;
}

/** One key's limits as a row keeps them: the short names keep rows small. */
export interface RowLimit {
  /** The key. */
  k: string;
  /** Concurrency, if declared. */
  n?: number;
  /** Rate: at most `r` in any `p` milliseconds, if declared. */
  r?: number;
  p?: number;
  /** The rate's burst, if declared below `r`. */
  b?: number;
  /** This start's cost against the rate. */
  c?: number;
}

/** A task's flow control, checked. */
export interface Flow {
  readonly limits: readonly Limit<unknown>[];
  readonly fairness: Fairness<unknown> | null;
}

/** Longest key: the same bound as an idempotency key. */
const MAX_KEY_LENGTH = 500;
/** Most keys one task may hold: each is a row the claim locks. */
export const MAX_LIMITS = 8;
/** Longest rate window: a day. */
const MAX_PERIOD_MS = 86_400_000;

/** Checks a task's `limits` and `fairness` at defineTask; null when it has neither. */
export function checkFlow(task: string, limits: unknown, fairness: unknown): Flow | null {
  if (limits === undefined && fairness === undefined) return null;
  const bad = (m: string): never => {
    throw new ConfigError(`outlive: task "${task}": ${m}`);
  };
  const list = limits ?? [];
  if (!Array.isArray(list)) bad('limits must be an array of { key, concurrency?, rate?, cost? }');
  if ((list as unknown[]).length > MAX_LIMITS) bad(`at most ${MAX_LIMITS} limits per task`);
  for (const [i, l] of (list as Limit[]).entries()) {
    const at = `limits[${i}]`;
    if (!l || typeof l !== 'object') bad(`${at} must be an object { key, concurrency?, rate?, cost? }`);
    const unknown = Object.keys(l).filter((k) => !['key', 'concurrency', 'rate', 'cost'].includes(k));
    if (unknown.length) bad(`${at} has unknown option(s) ${unknown.join(', ')}: use key, concurrency, rate, cost`);
    if (typeof l.key !== 'function') checkKey(l.key, `${at}.key`, bad);
    if (l.concurrency === undefined && l.rate === undefined) bad(`${at} needs concurrency or rate`);
    if (l.concurrency !== undefined && !isWhole(l.concurrency, { min: 1, max: 1_000_000 })) bad(`${at}.concurrency must be a whole number from 1 to 1000000`);
    if (l.rate !== undefined) {
      if (!l.rate || typeof l.rate !== 'object') bad(`${at}.rate must be { limit, periodMs, burst? }`);
      const unknownRate = Object.keys(l.rate).filter((k) => !['limit', 'periodMs', 'burst'].includes(k));
      if (unknownRate.length) bad(`${at}.rate has unknown option(s) ${unknownRate.join(', ')}: use limit, periodMs, burst`);
      if (!isWhole(l.rate.limit, { min: 1, max: 2 ** 31 - 1 })) bad(`${at}.rate.limit must be a whole number >= 1`);
      if (!isWhole(l.rate.periodMs, { min: 1, max: MAX_PERIOD_MS })) bad(`${at}.rate.periodMs must be a whole number of milliseconds from 1 to ${MAX_PERIOD_MS}`);
      if (l.rate.burst !== undefined && !validCost(l.rate.burst)) bad(`${at}.rate.burst must be a number > 0 (units of cost that may start back to back)`);
    }
    if (l.cost !== undefined) {
      if (l.rate === undefined) bad(`${at}.cost counts against a rate: give rate too`);
      if (typeof l.cost !== 'function' && !validCost(l.cost)) bad(`${at}.cost must be a number > 0 or a function of the input`);
    }
  }
  if (fairness !== undefined) {
    if (!fairness || typeof fairness !== 'object' || !('key' in fairness)) bad('fairness must be { key }');
    const key = (fairness as Fairness).key;
    if (typeof key !== 'function') checkKey(key, 'fairness.key', bad);
  }
  return Object.freeze({ limits: Object.freeze([...(list as Limit[])]), fairness: (fairness as Fairness | undefined) ?? null });
}

function validCost(c: unknown): c is number {
  return typeof c === 'number' && Number.isFinite(c) && c > 0;
}

function checkKey(key: unknown, where: string, bad: (m: string) => never): string {
  if (typeof key !== 'string' || key.length === 0 || key.length > MAX_KEY_LENGTH) bad(`${where} must be a non-empty string of at most ${MAX_KEY_LENGTH} characters`);
  if (storableText(key as string) !== key) bad(`${where} must not contain NUL characters or unpaired surrogates`);
  return key as string;
}

/** What one row keeps of its task's flow control: its fairness key ('' with limits only) and its limits as JSON. */
export interface RowFlow {
  fairKey: string;
  limits: string | null;
}

/**
 * Resolves a task's flow control for one input: computes its keys and
 * costs, merges the limits of one key, and refuses (before anything is
 * written) a key that is not a string or a cost that could never start.
 */
export function resolveFlow(task: string, flow: Flow, input: unknown): RowFlow {
  const bad = (m: string): never => {
    throw new InvalidEnqueueError(`outlive: cannot enqueue "${task}": ${m}`);
  };
  const byKey = new Map<string, RowLimit>();
  for (const [i, l] of flow.limits.entries()) {
    const key = checkKey(typeof l.key === 'function' ? call(() => (l.key as (i: unknown) => string)(input), `limits[${i}].key`, bad) : l.key, `limits[${i}].key`, bad);
    const row = byKey.get(key) ?? { k: key };
    if (l.concurrency !== undefined) {
      if (row.n !== undefined && row.n !== l.concurrency) bad(`key "${key}" is given two concurrencies (${row.n} and ${l.concurrency})`);
      row.n = l.concurrency;
    }
    if (l.rate !== undefined) {
      if (row.r !== undefined) bad(`key "${key}" is given two rates: one rate per key`);
      row.r = l.rate.limit;
      row.p = l.rate.periodMs;
      if (l.rate.burst !== undefined && l.rate.burst < l.rate.limit) row.b = l.rate.burst;
      const cost = l.cost === undefined ? 1 : typeof l.cost === 'function' ? call(() => (l.cost as (i: unknown) => number)(input), `limits[${i}].cost`, bad) : l.cost;
      if (!validCost(cost)) bad(`limits[${i}].cost must be a number > 0, got ${String(cost)}`);
      if (cost > l.rate.limit) bad(`a start costing ${cost} can never fit the rate of key "${key}" (${l.rate.limit} per ${l.rate.periodMs} ms)`);
      if (cost !== 1) row.c = cost;
    }
    byKey.set(key, row);
  }
  let fairKey = '';
  if (flow.fairness) {
    const k = flow.fairness.key;
    fairKey = checkKey(typeof k === 'function' ? call(() => k(input), 'fairness.key', bad) : k, 'fairness.key', bad);
  }
  const limits = [...byKey.values()].sort((a, b) => (a.k < b.k ? -1 : a.k > b.k ? 1 : 0));
  return { fairKey, limits: limits.length ? JSON.stringify(limits) : null };
}

function call<T>(fn: () => T, where: string, bad: (m: string) => never): T {
  try {
    return fn();
  } catch (err) {
    return bad(`${where} threw: ${(err as Error)?.message ?? String(err)}`);
  }
}
