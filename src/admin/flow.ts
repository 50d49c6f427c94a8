/**
 * Flow control at run time: limits, pauses and weights live in rows, so an
 * operator changes them from the API, the CLI or the dashboard and the next
 * claim obeys, without a deploy.
 */
import { toExecutor, toPool, type Database, type Executor, type Transactional } from '../db/executor.js';
import { checkName, isWhole } from '../model/checks.js';
import { OutliveError } from '../model/errors.js';
import { storableText } from '../model/json.js';

/** A flow-control call with a value that cannot work. Nothing was written. */
export class FlowControlError extends OutliveError {}

/** What `setLimit` sets; `null` clears an override (tasks' declared limit applies again); a field left out is kept. */
export interface LimitOverride {
  concurrency?: number | null;
  rate?: { limit: number; periodMs: number } | null;
}

/** A key's state, as `limitStatus` reads it. */
export interface LimitStatus {
  key: string;
  running: number;
  concurrency: number | null;
  rate: { limit: number; periodMs: number } | null;
  /** Till when no task of the key starts; a pause until resumed reads as the largest Date. */
  pausedUntil: Date | null;
  pausedReason: string | null;
  /** Who paused it: by hand (pauseKey, the CLI, the dashboard) or a task's RateLimitedError. */
  pausedBy: 'hand' | '429' | null;
  /** Tasks waiting for this key, counted up to 10,000. */
  waiting: number;
}

/** A pool, a client in a transaction or a drizzle database or transaction. */
function executorOf(db: Transactional | Database): Executor {
  return 'query' in db || 'execute' in db ? toExecutor(db as Transactional) : toExecutor(toPool(db));
}

function checkKey(key: unknown): string {
  if (typeof key !== 'string' || key.length === 0 || key.length > 500 || storableText(key) !== key) {
    throw new FlowControlError('outlive: a limit key must be a non-empty string of at most 500 characters, without NUL characters');
  }
  return key;
}

function now(at: Date | undefined): Date | null {
  if (at !== undefined && (!(at instanceof Date) || Number.isNaN(at.getTime()))) throw new FlowControlError('outlive: now must be a valid Date');
  return at ?? null;
}

// A change that may free room makes the key's waiting tasks due at once
// ('-infinity': due whatever the clock of the claim or view that reads it).
const UPSERT_LIMIT_SQL = `
INSERT INTO outlive.limits AS l (key, concurrency, rate_limit, rate_period_ms, wake_at, updated_at)
VALUES ($1, $2, $3, $4, NULL, coalesce($5::timestamptz, pg_catalog.now()))
ON CONFLICT (key) DO UPDATE
SET concurrency = CASE WHEN $6 THEN excluded.concurrency ELSE l.concurrency END,
    rate_limit = CASE WHEN $7 THEN excluded.rate_limit ELSE l.rate_limit END,
    rate_period_ms = CASE WHEN $7 THEN excluded.rate_period_ms ELSE l.rate_period_ms END,
    wake_at = CASE WHEN l.wake_at IS NULL THEN NULL ELSE '-infinity'::timestamptz END,
    updated_at = coalesce($5::timestamptz, pg_catalog.now())`;

/**
 * Overrides a key's limits at run time, over what tasks declare: the next
 * claim obeys, and tasks waiting for the key are looked at again.
 *
 * ```ts
 * await setLimit(db, 'openai', { concurrency: 2 });              // the provider is struggling
 * await setLimit(db, 'openai', { concurrency: null });           // back to what the tasks declare
 * ```
 */
export async function setLimit(db: Transactional | Database, key: string, override: LimitOverride, options: { now?: Date } = {}): Promise<void> {
  checkKey(key);
  if (!override || typeof override !== 'object') throw new FlowControlError('outlive: setLimit takes { concurrency?, rate? }');
  const unknown = Object.keys(override).filter((k) => k !== 'concurrency' && k !== 'rate');
  if (unknown.length) throw new FlowControlError(`outlive: setLimit: unknown option(s) ${unknown.join(', ')}: use concurrency, rate`);
  const { concurrency, rate } = override;
  if (concurrency != null && !isWhole(concurrency, { min: 1, max: 1_000_000 })) {
    throw new FlowControlError('outlive: setLimit: concurrency must be a whole number from 1 to 1000000, or null to clear it');
  }
  if (rate != null && (typeof rate !== 'object' || !isWhole(rate.limit, { min: 1, max: 2 ** 31 - 1 }) || !isWhole(rate.periodMs, { min: 1, max: 86_400_000 }))) {
    throw new FlowControlError('outlive: setLimit: rate must be { limit: whole number >= 1, periodMs: 1 to 86400000 }, or null to clear it');
  }
  await executorOf(db).query(UPSERT_LIMIT_SQL, [
    key,
    concurrency ?? null,
    rate?.limit ?? null,
    rate?.periodMs ?? null,
    now(options.now),
    'concurrency' in override,
    'rate' in override,
  ]);
}

// A pause by hand never shortens one in force (a 429's, or an earlier one
// by hand): resumeKey ends a pause.
const PAUSE_KEY_SQL = `
INSERT INTO outlive.limits AS l (key, paused_until, paused_reason, paused_by, updated_at)
VALUES ($1, $2::timestamptz, $3, 'hand', coalesce($4::timestamptz, pg_catalog.now()))
ON CONFLICT (key) DO UPDATE
SET paused_until = greatest(excluded.paused_until, CASE WHEN l.paused_until OPERATOR(pg_catalog.>) excluded.updated_at THEN l.paused_until END),
    paused_reason = CASE WHEN l.paused_until OPERATOR(pg_catalog.>) excluded.paused_until THEN l.paused_reason ELSE excluded.paused_reason END,
    paused_by = CASE WHEN l.paused_until OPERATOR(pg_catalog.>) excluded.paused_until THEN l.paused_by ELSE 'hand' END,
    updated_at = excluded.updated_at`;

const RESUME_KEY_SQL = `
UPDATE outlive.limits l
SET paused_until = NULL, paused_reason = NULL, paused_by = NULL,
    wake_at = CASE WHEN l.wake_at IS NULL THEN NULL ELSE '-infinity'::timestamptz END,
    updated_at = coalesce($2::timestamptz, pg_catalog.now())
WHERE l.key OPERATOR(pg_catalog.=) $1
RETURNING l.key`;

/**
 * Pauses a key: no task holding it starts until `until` (default: until
 * resumed). Running tasks run on.
 */
export async function pauseKey(db: Transactional | Database, key: string, options: { until?: Date; reason?: string; now?: Date } = {}): Promise<void> {
  checkKey(key);
  if (options.until !== undefined && (!(options.until instanceof Date) || Number.isNaN(options.until.getTime()))) {
    throw new FlowControlError('outlive: pauseKey: until must be a valid Date');
  }
  await executorOf(db).query(PAUSE_KEY_SQL, [key, options.until ?? 'infinity', reason(options.reason, 'paused by hand'), now(options.now)]);
}

/** Resumes a paused key (a pause by hand or a 429's); returns false if the key has no row. */
export async function resumeKey(db: Transactional | Database, key: string, options: { now?: Date } = {}): Promise<boolean> {
  checkKey(key);
  return (await executorOf(db).query(RESUME_KEY_SQL, [key, now(options.now)])).length > 0;
}

function reason(value: unknown, fallback: string): string {
  if (value === undefined) return fallback;
  if (typeof value !== 'string' || value.length > 500 || storableText(value) !== value) {
    throw new FlowControlError('outlive: a reason must be a string of at most 500 characters');
  }
  return value;
}

/** Pauses a queue: no pass claims its tasks until it is resumed. Running tasks run on. */
export async function pauseQueue(db: Transactional | Database, queue: string, options: { reason?: string } = {}): Promise<void> {
  checkQueue(queue);
  await executorOf(db).query(
    `INSERT INTO outlive.queue_pauses (queue, reason) VALUES ($1, $2) ON CONFLICT (queue) DO UPDATE SET reason = excluded.reason`,
    [queue, reason(options.reason, 'paused by hand')],
  );
}

/** Resumes a paused queue; returns false if it was not paused. */
export async function resumeQueue(db: Transactional | Database, queue: string): Promise<boolean> {
  checkQueue(queue);
  return (await executorOf(db).query(`DELETE FROM outlive.queue_pauses WHERE queue OPERATOR(pg_catalog.=) $1 RETURNING queue`, [queue])).length > 0;
}

function checkQueue(queue: unknown): void {
  try {
    checkName('queue', queue);
  } catch (err) {
    throw new FlowControlError((err as Error).message);
  }
}

/**
 * Sets a fairness key's weight in a queue: with weights 3 and 1, two keys
 * with ready tasks are served three turns to one. Default 1; applies to
 * tasks placed from now on.
 */
export async function setWeight(db: Transactional | Database, queue: string, key: string, weight: number): Promise<void> {
  checkQueue(queue);
  checkKey(key);
  if (typeof weight !== 'number' || !Number.isFinite(weight) || weight <= 0 || weight > 1000) {
    throw new FlowControlError('outlive: setWeight: weight must be a number > 0 and <= 1000');
  }
  await executorOf(db).query(
    `INSERT INTO outlive.fairness (queue, key, weight) VALUES ($1, $2, $3)
     ON CONFLICT (queue, key) DO UPDATE SET weight = excluded.weight, updated_at = pg_catalog.now()`,
    [queue, key, weight],
  );
}

const LIMITS_SQL = `
SELECT l.key, l.running, l.concurrency, l.rate_limit, l.rate_period_ms, l.paused_until, l.paused_reason, l.paused_by,
       (SELECT pg_catalog.count(*)::int FROM (SELECT 1 FROM outlive.tasks t
        WHERE t.blocked_on OPERATOR(pg_catalog.=) l.key AND t.state OPERATOR(pg_catalog.=) 'pending' LIMIT 10000) w) AS waiting
FROM outlive.limits l
WHERE $1::text[] IS NULL OR l.key OPERATOR(pg_catalog.=) ANY ($1::text[])
ORDER BY l.key
LIMIT 1000`;

/** The keys' state: running, overrides, pauses, tasks waiting. For the CLI, the dashboard and tests. */
export async function limitStatus(db: Transactional | Database, keys: readonly string[] | null = null): Promise<LimitStatus[]> {
  const rows = await executorOf(db).query<{
    key: string; running: number; concurrency: number | null; rate_limit: number | null; rate_period_ms: number | null;
    paused_until: Date | number | null; paused_reason: string | null; paused_by: 'hand' | '429' | null; waiting: number;
  }>(LIMITS_SQL, [keys]);
  return rows.map((r) => ({
    key: r.key,
    running: r.running,
    concurrency: r.concurrency,
    rate: r.rate_limit === null ? null : { limit: r.rate_limit, periodMs: r.rate_period_ms! },
    // node-postgres reads 'infinity' as the number Infinity.
    pausedUntil: r.paused_until === null ? null : r.paused_until instanceof Date ? r.paused_until : new Date(8.64e15),
    pausedReason: r.paused_reason,
    pausedBy: r.paused_by,
    waiting: r.waiting,
  }));
}
