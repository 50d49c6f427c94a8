/**
 * The checks every door of outlive shares, one of each: names, whole
 * numbers, ids, secrets' lengths, and how a schema's issues read in an error. A rule
 * lives here once, so enqueue, a batch, a schedule, a pass and the CLI
 * cannot drift apart (they once did: a batch's key check missed the NUL
 * character enqueue refused).
 */
import { ConfigError, OutliveError } from './errors.js';
import type { InputIssue } from './input-schema.js';

/** What task, queue and schedule names may be: 1-200 of letters, digits and _ . : / -, not starting with a symbol. */
export const NAME_PATTERN = /^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$/;

/** Checks a task, queue or schedule name, with a message that says what is allowed. */
export function checkName(kind: 'task' | 'queue' | 'schedule', name: unknown): string {
  if (typeof name !== 'string' || !NAME_PATTERN.test(name)) {
    throw new ConfigError(
      `outlive: ${kind} name ${JSON.stringify(name)} is invalid: use 1-200 characters of letters, digits and _ . : / -, not starting with a symbol`,
    );
  }
  return name;
}

/** Bounds of a whole number; both inclusive. */
export interface WholeBounds {
  min?: number;
  max?: number;
}

/** True for a whole number within the bounds. */
export function isWhole(value: unknown, { min = -Infinity, max = Infinity }: WholeBounds = {}): value is number {
  return Number.isInteger(value) && (value as number) >= min && (value as number) <= max;
}

/** The words for a whole number's bounds: ">= 1", "from 1 to 1000". */
export function wholeRange({ min, max }: WholeBounds): string {
  if (min !== undefined && max !== undefined) return `from ${min} to ${max}`;
  if (min !== undefined) return `>= ${min}`;
  if (max !== undefined) return `<= ${max}`;
  return '';
}

/**
 * Checks an option that must be a whole number; `what` names it ("tick
 * option budgetMs"). Throws `ErrorType` (a {@link ConfigError} by default)
 * saying what was given and what is allowed.
 */
export function checkWhole(what: string, value: unknown, bounds: WholeBounds = {}, ErrorType: new (m: string) => Error = ConfigError): number {
  if (!isWhole(value, bounds)) {
    throw new ErrorType(`outlive: ${what} must be a whole number ${wholeRange(bounds)}, got ${typeof value === 'string' ? JSON.stringify(value) : String(value)}`.replace('  ', ' '));
  }
  return value;
}

/** The largest id a task or run can have: ids are PostgreSQL bigints. */
const MAX_ID = 9_223_372_036_854_775_807n;

/**
 * Reads a task or run id as it arrives from a URL, the command line or an
 * admin call: the id in canonical decimal, or null when no row can have it
 * (0, or beyond a bigint), so the caller answers "not found" rather than
 * passing the database a value it fails on. Anything that is not a whole
 * number in decimal is refused with an error naming `kind`.
 */
export function parseId(kind: 'task' | 'run', text: unknown): string | null {
  const digits = typeof text === 'number' && Number.isSafeInteger(text) ? String(text) : typeof text === 'bigint' ? text.toString() : text;
  if (typeof digits !== 'string' || !/^[0-9]{1,100}$/.test(digits)) {
    throw new OutliveError(`outlive: a ${kind} id is a positive whole number, got ${typeof text === 'string' ? JSON.stringify(text.slice(0, 100)) : typeof text}`);
  }
  const id = BigInt(digits);
  return id >= 1n && id <= MAX_ID ? id.toString() : null;
}

/** Shortest secrets outlive accepts, by what they guard. */
export const MIN_SECRET_LENGTHS = {
  /** `OUTLIVE_DRAIN_SECRET`: it signs nudges (HMAC-SHA256), so 32 characters of `openssl rand -hex 32` and up. */
  drain: 32,
  /** `CRON_SECRET`: Vercel's cron sends it as a bearer token. */
  cron: 16,
  /** `OUTLIVE_DASHBOARD_TOKEN`: a browser presents it once for a session cookie. */
  dashboard: 16,
} as const;

/**
 * How a schema's issues read in an error: `path: message; path: message`,
 * `(input)` for the whole value. A Standard Schema path holds keys or
 * `{ key }` segments (valibot gives the latter); zod's keys read as they
 * always did.
 */
export function formatIssues(issues: readonly InputIssue[]): string {
  return issues.map((i) => `${i.path?.length ? i.path.map(pathKey).join('.') : '(input)'}: ${i.message}`).join('; ');
}

function pathKey(segment: PropertyKey | { readonly key: PropertyKey }): string {
  return String(typeof segment === 'object' && segment !== null ? segment.key : segment);
}
