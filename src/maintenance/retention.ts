/**
 * Retention: delete finished history older than a configurable age, in small
 * batches, so the tables stay small without one huge DELETE holding locks and
 * bloating WAL. Failed work is kept longer than succeeded work by default, so
 * there is time to look at it. Unfinished work is never touched.
 *
 * Each call does a bounded amount of work (about `maxRows` rows, in
 * statements of at most `batchSize` rows) and says whether more is left, so a
 * scheduled tick can call it every time and a worker can call it again soon
 * when `more`.
 */
import { ConfigError } from '../model/errors.js';
import { toExecutor, toPool, type Database, type Executor } from '../db/executor.js';

/** How long finished work is kept, and how much one call may delete. */
export interface RetentionOptions {
  /** Keep succeeded, cancelled and skipped tasks and runs this long after they finished. Default 7 days. */
  succeededMs?: number;
  /** Keep failed tasks and runs this long after they finished. Default 30 days. */
  failedMs?: number;
  /** Keep the record of fired schedule slots this long. Default: `succeededMs`. */
  slotsMs?: number;
  /** Rows per DELETE statement. Default 500. */
  batchSize?: number;
  /** Rows one call deletes at most (it stops starting batches once it has deleted this many). Default 10,000. */
  maxRows?: number;
  /** The time to measure ages from, for tests; default: the database's clock. */
  now?: Date;
}

/** What one call deleted. */
export interface RetentionReport {
  /** Standalone tasks (not part of a run). */
  tasks: number;
  /** Tasks of finished runs, deleted ahead of their run. */
  runTasks: number;
  runs: number;
  /** Records of fired schedule slots. */
  slots: number;
  /** Signals past their `keepMs` (src/write/signal.ts): kept ones no wait took, and the ids of consumed ones. */
  signals: number;
  /** DELETE statements run. */
  batches: number;
  /** True when the call stopped at `maxRows` with work left: call again. */
  more: boolean;
  durationMs: number;
}

const DAY = 86_400_000;

// The states a task or run ends in that count as "succeeded" for retention.
// Cancelled and skipped work is as uninteresting as succeeded work once old.
const SUCCEEDED_TASK_STATES = ['succeeded', 'cancelled', 'skipped'] as const;

// One state per statement, so the lookup is a range scan of
// tasks_state_finished_idx (state, finished_at) that stops at the LIMIT,
// rather than an OR of states that would read every old entry into a bitmap
// first. SKIP LOCKED lets two retention calls run at once without waiting on
// each other; the state is checked again on the locked row. The ORDER BY
// (oldest first) keeps every plan on that index: without it, a plan made
// without the cutoff's value (a generic plan, which Postgres may choose for a
// prepared statement by itself) read the table from its start until it found
// enough rows, the whole of the history when nothing is old enough
// (test/generic-plans.test.ts).
const DELETE_TASKS = `
WITH doomed AS (
  SELECT id FROM outlive.tasks
  WHERE state OPERATOR(pg_catalog.=) $1::outlive.task_state AND finished_at OPERATOR(pg_catalog.<) $2::timestamptz AND run_id IS NULL
  ORDER BY finished_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM outlive.tasks t USING doomed
  WHERE t.id OPERATOR(pg_catalog.=) doomed.id AND t.state OPERATOR(pg_catalog.=) $1::outlive.task_state AND t.run_id IS NULL
  RETURNING 1
)
SELECT pg_catalog.count(*)::int AS n FROM gone`;

// A run that finished long ago, none of whose tasks is still pending or
// running (a cancelled run may have a handler still running until its lease
// ends). finished_at >= created_at, so the created_at bound lets
// runs_created_idx narrow the scan to old runs without a new index.
const OLD_RUN = `
  r.created_at OPERATOR(pg_catalog.<) greatest($1::timestamptz, $2::timestamptz)
  AND ((r.state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'cancelled']::outlive.run_state[]) AND r.finished_at OPERATOR(pg_catalog.<) $1::timestamptz)
    OR (r.state OPERATOR(pg_catalog.=) 'failed' AND r.finished_at OPERATOR(pg_catalog.<) $2::timestamptz))
  AND NOT EXISTS (
    SELECT 1 FROM outlive.tasks u
    WHERE u.run_id OPERATOR(pg_catalog.=) r.id AND u.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[]))`;

// A run's tasks go first, a batch at a time, so a run of 100,000 tasks is not
// one cascading DELETE. The run row itself goes once it has no tasks left.
const DELETE_RUN_TASKS = `
WITH doomed AS (
  SELECT t.id FROM outlive.runs r JOIN outlive.tasks t ON t.run_id OPERATOR(pg_catalog.=) r.id
  WHERE ${OLD_RUN}
  LIMIT $3
  FOR UPDATE OF t SKIP LOCKED
), gone AS (
  DELETE FROM outlive.tasks t USING doomed
  WHERE t.id OPERATOR(pg_catalog.=) doomed.id AND t.state OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running']::outlive.task_state[])
  RETURNING 1
)
SELECT pg_catalog.count(*)::int AS n FROM gone`;

// The foreign key's ON DELETE CASCADE would take any task left behind; the
// NOT EXISTS makes sure there is none, so this never cascades into a big delete.
const DELETE_RUNS = `
WITH doomed AS (
  SELECT r.id FROM outlive.runs r
  WHERE ${OLD_RUN}
    AND NOT EXISTS (SELECT 1 FROM outlive.tasks t WHERE t.run_id OPERATOR(pg_catalog.=) r.id)
  LIMIT $3
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM outlive.runs r USING doomed
  WHERE r.id OPERATOR(pg_catalog.=) doomed.id AND r.state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'cancelled', 'failed']::outlive.run_state[])
  RETURNING 1
)
SELECT pg_catalog.count(*)::int AS n FROM gone`;

// Rows of `table` whose `column` is before $1, oldest first, $2 at most,
// found by their primary key `keys`.
const deleteBefore = (table: string, keys: readonly string[], column: string) => `
WITH doomed AS (
  SELECT ${keys.join(', ')} FROM outlive.${table}
  WHERE ${column} OPERATOR(pg_catalog.<) $1::timestamptz
  ORDER BY ${column}
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM outlive.${table} x USING doomed
  WHERE ${keys.map((k) => `x.${k} OPERATOR(pg_catalog.=) doomed.${k}`).join(' AND ')}
  RETURNING 1
)
SELECT pg_catalog.count(*)::int AS n FROM gone`;

// A fired slot can never be fired again once its schedule's next_slot has
// passed it (next_slot only moves forward), so old slot rows are history only.
const DELETE_SLOTS = deleteBefore('schedule_slots', ['schedule', 'slot'], 'slot');

// A signal past its keep is neither taken by a wait (begin_waits skips it)
// nor needed to know its id again: the sender set that window.
const DELETE_SIGNALS = deleteBefore('signals', ['key', 'id'], 'expires_at');

function positive(name: string, value: number | undefined, fallback: number, integer = false): number {
  const v = value ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0 || (integer && !Number.isInteger(v))) {
    throw new ConfigError(`outlive: retention option ${name} must be a ${integer ? 'whole number' : 'number'} > 0, got ${String(value)}`);
  }
  return v;
}

/** Checks retention options and fills in the defaults. Throws a {@link ConfigError} naming a bad one. */
export function retentionConfig(options: RetentionOptions = {}) {
  const succeededMs = positive('succeededMs', options.succeededMs, 7 * DAY);
  return {
    succeededMs,
    failedMs: positive('failedMs', options.failedMs, 30 * DAY),
    slotsMs: positive('slotsMs', options.slotsMs, succeededMs),
    batchSize: positive('batchSize', options.batchSize, 500, true),
    maxRows: positive('maxRows', options.maxRows, 10_000, true),
  };
}

/**
 * Deletes finished tasks, runs and schedule-slot records older than their
 * retention age, and signals past their keep, in batches, and reports how many of each.
 *
 * ```ts
 * const r = await applyRetention(pool, { succeededMs: 3 * 86_400_000 });
 * if (r.more) // maxRows was reached: call again soon
 * ```
 *
 * Pending and running tasks are never deleted, nor a run with any task still
 * pending or running. Tasks of a run are deleted only with their run, once
 * the whole run is old enough.
 */
export async function applyRetention(db: Database, options: RetentionOptions = {}): Promise<RetentionReport> {
  const started = performance.now();
  const cfg = retentionConfig(options);
  const exec: Executor = toExecutor(toPool(db));
  const now = options.now ?? new Date((await exec.query<{ now: Date }>('SELECT pg_catalog.now() AS now'))[0]!.now);
  const ago = (ms: number) => new Date(now.getTime() - ms);
  const succeededBefore = ago(cfg.succeededMs);
  const failedBefore = ago(cfg.failedMs);
  const report: RetentionReport = { tasks: 0, runTasks: 0, runs: 0, slots: 0, signals: 0, batches: 0, more: false, durationMs: 0 };

  let deleted = 0;
  // Runs one kind of batch until it comes back short (nothing more of that
  // kind, or the rest is locked by a concurrent call that is deleting it) or
  // the call has deleted maxRows. A kind with nothing to delete costs one
  // statement that finds nothing.
  const drain = async (text: string, params: unknown[]): Promise<number> => {
    let total = 0;
    for (;;) {
      const room = cfg.maxRows - deleted;
      if (room <= 0) {
        report.more = true;
        return total;
      }
      const limit = Math.min(cfg.batchSize, room);
      report.batches++;
      const [row] = await exec.query<{ n: number }>(text, [...params, limit]);
      const n = row?.n ?? 0;
      total += n;
      deleted += n;
      if (n < limit) return total;
    }
  };

  for (const state of SUCCEEDED_TASK_STATES) {
    report.tasks += await drain(DELETE_TASKS, [state, succeededBefore]);
  }
  report.tasks += await drain(DELETE_TASKS, ['failed', failedBefore]);
  report.runTasks += await drain(DELETE_RUN_TASKS, [succeededBefore, failedBefore]);
  report.runs += await drain(DELETE_RUNS, [succeededBefore, failedBefore]);
  report.slots += await drain(DELETE_SLOTS, [ago(cfg.slotsMs)]);
  report.signals += await drain(DELETE_SIGNALS, [now]);
  report.durationMs = Math.round(performance.now() - started);
  return report;
}
