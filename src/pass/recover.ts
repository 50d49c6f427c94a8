/**
 * Recover: hand back tasks whose lease expired because the pass holding them
 * died (killed, crashed, timed out by its platform).
 */
import { inTransaction, toPool, type Database } from '../db/executor.js';
import { applyRunEffects, recountWaits } from './run-effects.js';
import type { SettledRow } from './settle.js';
import { MAX_INTERRUPTIONS } from '../model/task.js';

/** What a recovery pass did. */
export interface RecoverReport {
  /** Tasks put back to pending for another attempt (the interrupted one not counted). */
  retried: number;
  /** Tasks that failed for good: interrupted more than MAX_INTERRUPTIONS times, or declared with one attempt. */
  failed: number;
  /** Tasks of runs whose count of unfinished dependencies was corrected (see `outlive.recounts`). */
  recounted: number;
  rows: SettledRow[];
}

/**
 * SQL for when the running row aliased `t` is held until: the later of its
 * own lease and its pass's. What an operator is shown, by the rule
 * RECOVER_SQL applies.
 */
export const heldUntil = (t: string) =>
  `greatest(${t}.lease_expires_at, (SELECT l.expires_at FROM outlive.leases l WHERE l.owner OPERATOR(pg_catalog.=) ${t}.lease_owner))`;

// A running row is held while its own lease (written by its claim) or its
// pass's lease (outlive.leases, renewed by the pass while it runs long
// tasks) lives; recovery takes rows where both have expired. The lock (FOR
// UPDATE SKIP LOCKED) and the recheck in the UPDATE make this a
// compare-and-set: a completion that commits first leaves a row that no
// longer matches, so a recovery racing a completion never overwrites it. A
// pass lease renewed after this statement's snapshot does not save the row:
// its pass let it expire, and its late settle is dropped. The expired attempt
// is an interruption, not the handler's failure: it is handed back without
// spending one of the task's attempts (max_attempts grows by one, so attempt
// numbers stay unique), up to $3 interruptions, after which the task fails
// with that reason; a task declared with one attempt (at most once) is never
// run again. The next attempt backs off exponentially from 1 s by
// interruption, at most 5 minutes (the task's own policy is code, not a
// row): a task that crashes its process every time ends within about an
// hour. Expired pass leases are deleted on the way: they hold nothing.
// The slots the recovered tasks held are given back in this statement
// (outlive.release_slots, migration 0014), so a task's slot is freed exactly
// when its row stops running. A recovered governed task is placed in turn
// again when its retry is due (vt = NULL).
export const RECOVER_SQL = `
WITH expired AS (
  SELECT t.id,
         t.max_attempts OPERATOR(pg_catalog.=) 1 OR t.interruptions OPERATOR(pg_catalog.>=) $3::int AS spent,
         'lease expired: the pass running attempt ' OPERATOR(pg_catalog.||) t.attempts OPERATOR(pg_catalog.||) ' stopped before settling it' OPERATOR(pg_catalog.||)
         CASE WHEN t.max_attempts OPERATOR(pg_catalog.=) 1 THEN ' (maxAttempts 1: not run again)'
              WHEN t.interruptions OPERATOR(pg_catalog.>=) $3 THEN ' (interrupted ' OPERATOR(pg_catalog.||) (t.interruptions OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.||) ' times, more than ' OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) ')'
              ELSE ' (interruption ' OPERATOR(pg_catalog.||) (t.interruptions OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.||) ' of ' OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) ', not counted as an attempt)' END AS message
  FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'running' AND t.lease_expires_at OPERATOR(pg_catalog.<) coalesce($1::timestamptz, pg_catalog.now())
    AND NOT EXISTS (SELECT 1 FROM outlive.leases l
                    WHERE l.owner OPERATOR(pg_catalog.=) t.lease_owner AND l.expires_at OPERATOR(pg_catalog.>=) coalesce($1::timestamptz, pg_catalog.now()))
  ORDER BY t.lease_expires_at
  LIMIT $2
  FOR UPDATE OF t SKIP LOCKED
),
gone AS (
  DELETE FROM outlive.leases WHERE expires_at OPERATOR(pg_catalog.<) coalesce($1::timestamptz, pg_catalog.now())
),
recovered AS (
UPDATE outlive.tasks t
SET state = CASE WHEN expired.spent THEN 'failed' ELSE 'pending' END::outlive.task_state,
    interruptions = CASE WHEN expired.spent THEN t.interruptions ELSE t.interruptions OPERATOR(pg_catalog.+) 1 END,
    max_attempts = CASE WHEN expired.spent THEN t.max_attempts ELSE t.max_attempts OPERATOR(pg_catalog.+) 1 END,
    run_at = CASE WHEN expired.spent THEN t.run_at
                  ELSE coalesce($1::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+)
                       (least(300000, 1000 OPERATOR(pg_catalog.*) (2 OPERATOR(pg_catalog.^) least(t.interruptions, 30)))
                        OPERATOR(pg_catalog.*) interval '1 millisecond') END,
    last_error = expired.message,
    errors = t.errors OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
      'attempt', t.attempts,
      'at', coalesce($1::timestamptz, pg_catalog.now()),
      'name', 'LeaseExpired',
      'message', expired.message)),
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = CASE WHEN expired.spent THEN coalesce($1::timestamptz, pg_catalog.now()) END,
    vt = NULL,
    blocked_on = NULL,
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
FROM expired
WHERE t.id OPERATOR(pg_catalog.=) expired.id AND t.state OPERATOR(pg_catalog.=) 'running'
  AND t.lease_expires_at OPERATOR(pg_catalog.<) coalesce($1::timestamptz, pg_catalog.now())
RETURNING t.id::text, t.state::text, t.run_id::text, t.step, t.limits, t.attempts
),
slots AS (
  SELECT outlive.release_slots(
           coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(r.limits, r.id, r.attempts)) FILTER (WHERE r.limits IS NOT NULL), '[]'::jsonb),
           $1::timestamptz) AS n
  FROM recovered r
)
SELECT r.id, r.state, r.run_id, r.step FROM recovered r, slots`;

/**
 * Recovers up to `limit` tasks whose lease expired before `now` (default: the
 * database's clock). A recovered task of a run that has no attempts left
 * fails its downstream tasks and run in the same transaction. It also
 * recounts the tasks spawns listed as unsure of their release.
 */
export async function recover(db: Database, options: { now?: Date | null; limit?: number } = {}): Promise<RecoverReport> {
  const now = options.now ?? null;
  const { rows, recounted } = await inTransaction(toPool(db), async (tx) => {
    const recovered = await tx.query<SettledRow>(RECOVER_SQL, [now, options.limit ?? 1000, MAX_INTERRUPTIONS]);
    await applyRunEffects(tx, recovered, new Map(), now);
    return { rows: recovered, recounted: await recountWaits(tx, now) };
  });
  let failed = 0;
  for (const r of rows) if (r.state === 'failed') failed++;
  return { retried: rows.length - failed, failed, recounted, rows };
}
