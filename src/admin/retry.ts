/**
 * Retry by hand: put a task that failed for good (or was cancelled) back to
 * pending with a fresh set of attempts, or a finished run's unsuccessful
 * tasks back to work. The error history stays in the rows.
 */
import { parseId } from '../model/checks.js';
import { OutliveError } from '../model/errors.js';
import { inTransactionRetryingDeadlocks, toExecutor, toPool, type Database, type Executor } from '../db/executor.js';
import type { RunState, TaskState } from '../model/states.js';

/** What a retry did. */
export interface RetryReport {
  /** False when there was nothing to retry (see `state` and `reason`). */
  retried: boolean;
  /** The task's (or run's) state after the call; null if it does not exist. */
  state: TaskState | RunState | null;
  /** Tasks put back to pending. */
  tasks: number;
  /** Why nothing was retried. */
  reason?: string;
}

const RETRY_TASK_SQL = `
UPDATE outlive.tasks
SET state = 'pending', attempts = 0, max_attempts = max_attempts OPERATOR(pg_catalog.-) interruptions OPERATOR(pg_catalog.-) snoozes, interruptions = 0, snoozes = 0, run_at = coalesce($2::timestamptz, pg_catalog.now()), finished_at = NULL, vt = NULL, blocked_on = NULL,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = coalesce($2::timestamptz, pg_catalog.now())
WHERE id OPERATOR(pg_catalog.=) ANY ($1::bigint[]) AND run_id IS NULL AND state OPERATOR(pg_catalog.=) ANY (ARRAY['failed', 'cancelled']::outlive.task_state[])
RETURNING id::text`;

// Tasks first, then the run: the lock order of settles.
const REVIVE_RUN_TASKS_SQL = `
WITH locked AS (
  SELECT id FROM outlive.tasks
  WHERE run_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) ANY (ARRAY['failed', 'skipped', 'cancelled']::outlive.task_state[])
  ORDER BY id FOR UPDATE
)
UPDATE outlive.tasks t
SET state = 'pending', attempts = 0, max_attempts = max_attempts OPERATOR(pg_catalog.-) interruptions OPERATOR(pg_catalog.-) snoozes, interruptions = 0, snoozes = 0, run_at = coalesce($2::timestamptz, pg_catalog.now()), finished_at = NULL, vt = NULL, blocked_on = NULL,
    lease_owner = NULL, lease_expires_at = NULL, wait_key = NULL, wait_until = NULL, signal = NULL, updated_at = coalesce($2::timestamptz, pg_catalog.now())
FROM locked WHERE t.id OPERATOR(pg_catalog.=) locked.id
RETURNING t.id`;

// Every revived task waits again for its dependencies that have not succeeded.
const RECOUNT_SQL = `
UPDATE outlive.tasks t
SET waiting_on = (SELECT pg_catalog.count(*) FROM outlive.task_deps d JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
                  WHERE d.task_id OPERATOR(pg_catalog.=) t.id AND p.state OPERATOR(pg_catalog.<>) 'succeeded')
WHERE t.id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`;

const REOPEN_RUN_SQL = `
UPDATE outlive.runs
SET state = 'running', unfinished = $2, failed_task_id = NULL, error = NULL, finished_at = NULL,
    updated_at = coalesce($3::timestamptz, pg_catalog.now())
WHERE id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) ANY (ARRAY['failed', 'cancelled']::outlive.run_state[])
RETURNING id`;

class NothingToRetry extends Error {
  constructor(readonly report: RetryReport) {
    super(report.reason);
  }
}

async function reviveRun(tx: Executor, runId: string, now: Date | null): Promise<RetryReport> {
  const [run] = await tx.query<{ state: RunState }>(`SELECT state::text FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`, [runId]);
  if (!run) return { retried: false, state: null, tasks: 0, reason: `no run ${runId}` };
  if (run.state === 'succeeded') return { retried: false, state: run.state, tasks: 0, reason: 'the run succeeded' };
  if (run.state === 'running') {
    return { retried: false, state: run.state, tasks: 0, reason: 'the run is still running: retry it once it has finished' };
  }
  const revived = await tx.query<{ id: string }>(REVIVE_RUN_TASKS_SQL, [runId, now]);
  await tx.query(RECOUNT_SQL, [revived.map((r) => r.id)]);
  const reopened = await tx.query(REOPEN_RUN_SQL, [runId, revived.length, now]);
  // The run finished between our read and our lock: undo by throwing.
  if (reopened.length === 0) throw new NothingToRetry({ retried: false, state: null, tasks: 0, reason: 'the run changed meanwhile; try again' });
  return { retried: true, state: 'running', tasks: revived.length };
}

/**
 * Retries a finished run that failed or was cancelled: its failed, skipped
 * and cancelled tasks go back to pending with fresh attempts (each waiting
 * again for its dependencies that have not succeeded), and the run is running
 * again. Succeeded tasks keep their outputs and are not run again.
 */
export async function retryRun(db: Database, runText: string, options: { now?: Date } = {}): Promise<RetryReport> {
  const runId = parseId('run', runText);
  if (runId === null) return { retried: false, state: null, tasks: 0, reason: `no run ${runText}` };
  try {
    return await inTransactionRetryingDeadlocks(toPool(db), (tx) => reviveRun(tx, runId, options.now ?? null));
  } catch (err) {
    if (err instanceof NothingToRetry) return err.report;
    throw err;
  }
}

/**
 * Retries a task that failed for good or was cancelled: pending again at
 * once, with a fresh set of attempts. A task of a run is retried with its run
 * (see {@link retryRun}), so the tasks it would have released run too.
 */
export async function retryTask(db: Database, taskText: string, options: { now?: Date } = {}): Promise<RetryReport> {
  const taskId = parseId('task', taskText);
  if (taskId === null) return { retried: false, state: null, tasks: 0, reason: `no task ${taskText}` };
  const now = options.now ?? null;
  try {
    return await inTransactionRetryingDeadlocks(toPool(db), async (tx) => {
      const [task] = await tx.query<{ state: TaskState; run_id: string | null }>(
        `SELECT state::text, run_id::text FROM outlive.tasks WHERE id OPERATOR(pg_catalog.=) $1`,
        [taskId],
      );
      if (!task) return { retried: false, state: null, tasks: 0, reason: `no task ${taskId}` };
      if (task.run_id) {
        if (task.state !== 'failed' && task.state !== 'cancelled' && task.state !== 'skipped') {
          return { retried: false, state: task.state, tasks: 0, reason: `the task is ${task.state}` };
        }
        return reviveRun(tx, task.run_id, now);
      }
      if (task.state !== 'failed' && task.state !== 'cancelled') {
        return { retried: false, state: task.state, tasks: 0, reason: `the task is ${task.state}, not failed or cancelled` };
      }
      try {
        const rows = await tx.query(RETRY_TASK_SQL, [[taskId], now]);
        return { retried: rows.length === 1, state: rows.length === 1 ? 'pending' : task.state, tasks: rows.length };
      } catch (err) {
        if ((err as { code?: string }).code === '23505') {
          throw new OutliveError(`outlive: task ${taskId} cannot be retried: another unfinished task holds its idempotency key`, { cause: err });
        }
        throw err;
      }
    });
  } catch (err) {
    if (err instanceof NothingToRetry) return err.report;
    throw err;
  }
}

/** What a retry of many tasks did. */
export interface RetryManyReport {
  /** Tasks outside runs put back to pending. */
  tasks: number;
  /** Runs retried (each with its unsuccessful tasks) because one of the tasks belonged to it. */
  runs: number;
  /** Tasks outside runs not retried: gone, no longer failed or cancelled, or another unfinished task holds their idempotency key. */
  skipped: number;
}

/**
 * Retries many tasks at once, as {@link retryTask} retries one: those
 * outside runs by one guarded statement (a task that is no longer failed or
 * cancelled is left as it is), those of runs with their runs.
 */
export async function retryTasks(db: Database, taskIds: readonly string[], options: { now?: Date } = {}): Promise<RetryManyReport> {
  const now = options.now ?? null;
  const pool = toPool(db);
  const report: RetryManyReport = { tasks: 0, runs: 0, skipped: 0 };
  if (taskIds.length === 0) return report;
  const rows = (await pool.query(`SELECT id::text, run_id::text FROM outlive.tasks WHERE id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`, [taskIds])).rows as { id: string; run_id: string | null }[];
  const plain = rows.filter((r) => r.run_id === null).map((r) => r.id);
  const runs = [...new Set(rows.filter((r) => r.run_id !== null).map((r) => r.run_id!))];
  try {
    report.tasks = (await toExecutor(pool).query(RETRY_TASK_SQL, [plain, now])).length;
  } catch (err) {
    // One of them collides with an unfinished task's idempotency key: one at a time, so the others still go.
    if ((err as { code?: string }).code !== '23505') throw err;
    for (const id of plain) {
      const r = await retryTask(db, id, options).catch((e: unknown) => (e instanceof OutliveError ? null : Promise.reject(e)));
      if (r?.retried) report.tasks += 1;
    }
  }
  for (const run of runs) if ((await retryRun(db, run, options)).retried) report.runs += 1;
  report.skipped = taskIds.length - rows.length + plain.length - report.tasks;
  return report;
}
