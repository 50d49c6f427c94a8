/**
 * Cancel: stop a run, or tasks outside runs. Pending tasks are cancelled at
 * once; running tasks are marked cancelled too, so their passes' settles
 * match nothing and they are never retried, and those passes fire the
 * handlers' signals at their next lease check.
 */
import { parseId } from '../model/checks.js';
import { inTransactionRetryingDeadlocks, toPool, type Database } from '../db/executor.js';
import type { RunState } from '../model/states.js';

// Tasks first, run last: the same lock order as settles, so a cancel racing a
// settle of the same run queues behind it instead of deadlocking.
// Running tasks' slots are given back by this statement (outlive.release_slots).
// $1 picks the tasks: a run's (`run`), or tasks outside runs by id (`ids`).
const cancelTasksSql = (which: 'run' | 'ids') => `
WITH locked AS (
  SELECT id, state FROM outlive.tasks
  WHERE ${which === 'run' ? 'run_id OPERATOR(pg_catalog.=) $1' : 'id OPERATOR(pg_catalog.=) ANY ($1::bigint[]) AND run_id IS NULL'}
    AND state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[])
  ORDER BY id FOR UPDATE
), cancelled AS (
UPDATE outlive.tasks t
SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL,
    last_error = coalesce($3, t.last_error),
    finished_at = coalesce($2::timestamptz, pg_catalog.now()), updated_at = coalesce($2::timestamptz, pg_catalog.now())
FROM locked WHERE t.id OPERATOR(pg_catalog.=) locked.id
RETURNING locked.state::text AS was, t.id::text, t.attempts, t.limits
), slots AS (
  SELECT outlive.release_slots(
           coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(c.limits, c.id, c.attempts))
                      FILTER (WHERE c.was OPERATOR(pg_catalog.=) 'running' AND c.limits IS NOT NULL), '[]'::jsonb),
           $2::timestamptz) AS n
  FROM cancelled c
)
SELECT c.was FROM cancelled c, slots`;

const CANCEL_TASKS_SQL = cancelTasksSql('run');
const CANCEL_BY_ID_SQL = cancelTasksSql('ids');

const CANCEL_RUN_SQL = `
UPDATE outlive.runs
SET state = 'cancelled', unfinished = 0, error = coalesce(error, $3),
    finished_at = coalesce($2::timestamptz, pg_catalog.now()), updated_at = coalesce($2::timestamptz, pg_catalog.now())
WHERE id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'running'
RETURNING id`;

/** What a cancel did. */
export interface CancelReport {
  /** False when the run had already finished (or does not exist); nothing changed then. */
  cancelled: boolean;
  /** The run's state after the call, or null if there is no such run. */
  state: RunState | null;
  pendingCancelled: number;
  runningCancelled: number;
}

/**
 * Cancels a run that is still running. Safe to call twice; a finished run is
 * left as it is.
 */
export async function cancelRun(db: Database, runText: string, options: { now?: Date; reason?: string } = {}): Promise<CancelReport> {
  const runId = parseId('run', runText);
  if (runId === null) return { cancelled: false, state: null, pendingCancelled: 0, runningCancelled: 0 };
  const now = options.now ?? null;
  const reason = options.reason ?? 'cancelled';
  return inTransactionRetryingDeadlocks(toPool(db), async (tx): Promise<CancelReport> => {
    const [run] = await tx.query<{ state: RunState }>(`SELECT state::text FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`, [runId]);
    if (!run) return { cancelled: false, state: null, pendingCancelled: 0, runningCancelled: 0 };
    if (run.state !== 'running') return { cancelled: false, state: run.state, pendingCancelled: 0, runningCancelled: 0 };
    const first = await tx.query<{ was: string }>(CANCEL_TASKS_SQL, [runId, now, reason]);
    const closed = await tx.query(CANCEL_RUN_SQL, [runId, now, reason]);
    if (closed.length === 0) {
      // Another transaction finished the run meanwhile; ours is rolled back below.
      throw new RunChangedError();
    }
    // A settle that committed while we waited on its lock may have spawned
    // steps our first statement could not see; this one sees them.
    const second = await tx.query<{ was: string }>(CANCEL_TASKS_SQL, [runId, now, reason]);
    const all = [...first, ...second];
    return {
      cancelled: true,
      state: 'cancelled',
      pendingCancelled: all.filter((r) => r.was === 'pending').length,
      runningCancelled: all.filter((r) => r.was === 'running').length,
    };
  }).catch(async (err: unknown) => {
    if (!(err instanceof RunChangedError)) throw err;
    const [row] = (await toPool(db).query(`SELECT state::text FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`, [runId])).rows as { state: RunState }[];
    return { cancelled: false, state: row?.state ?? null, pendingCancelled: 0, runningCancelled: 0 };
  });
}

class RunChangedError extends Error {}

/**
 * Cancels tasks outside runs that are pending or running, by id, in one
 * guarded statement: those that finished meanwhile (or belong to a run:
 * cancel the run) are left as they are. A running task's pass finds it
 * cancelled at its settle, which then matches nothing, and its slots of
 * limits are given back here. Returns how many were cancelled.
 */
export async function cancelTasks(db: Database, taskIds: readonly string[], options: { now?: Date; reason?: string } = {}): Promise<{ pending: number; running: number }> {
  if (taskIds.length === 0) return { pending: 0, running: 0 };
  const rows = await inTransactionRetryingDeadlocks(toPool(db), (tx) =>
    tx.query<{ was: string }>(CANCEL_BY_ID_SQL, [taskIds, options.now ?? null, options.reason ?? 'cancelled']),
  );
  return { pending: rows.filter((r) => r.was === 'pending').length, running: rows.filter((r) => r.was === 'running').length };
}
