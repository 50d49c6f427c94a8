/**
 * What the orchestrator knows about each system's tables: how to tell that
 * every job has finished, and how to check that each ran exactly once.
 */
import type { SystemName } from '../systems/protocol.ts';

/** Per-system SQL the orchestrator runs on the database under test. */
export interface SystemSql {
  /** Database name for this system's rounds (and `${db}_tpl` for its migrated template). */
  db: string;
  /** One row `{ n }`: jobs not yet finished (pending, running, locked, or waiting to be retried). */
  remaining: string;
  /** One row `{ total, distinct }`: job rows, and distinct payload indexes among them. */
  enqueued: string;
  /**
   * One row `{ done, repeated, left }` after a drain: jobs recorded as
   * completed (null where completed jobs are deleted), jobs that took more
   * than one attempt, and jobs still not completed.
   */
  finished: string;
  /** The schema holding the system's tables (the liveness phase sums their row writes). */
  schema: string;
  /**
   * One row `{ n }`: jobs a worker holds now (outlive: running; pg-boss:
   * active; graphile-worker: locked, which with its local queue as deep as
   * the concurrency means fetched to run).
   */
  running: string;
  /**
   * One row `{ held, again }` at epoch ms $1 (the moment a worker was
   * killed): jobs still held under a claim made before it, and jobs handed
   * back since (ready to run, waiting for their retry, or claimed again).
   * Null where a dead worker's jobs are not handed back within a phase.
   */
  heldSince: string | null;
}

/** heldSince of outlive and outlive-drop: one table (outlive-drop sits the recovery phase out). */
const OUTLIVE_HELD_SINCE = `
SELECT count(*) FILTER (WHERE state = 'running' AND started_at < to_timestamp($1::float8 / 1000))::int AS held,
       count(*) FILTER (WHERE state = 'pending' OR (state = 'running' AND started_at >= to_timestamp($1::float8 / 1000)))::int AS again
FROM outlive.tasks`;

/** The SQL of each system, by name. */
export const SQL: Record<SystemName, SystemSql> = {
  outlive: {
    db: 'bench_outlive',
    remaining: `SELECT count(*)::int AS n FROM outlive.tasks WHERE state IN ('pending', 'running')`,
    enqueued: `SELECT count(*)::int AS total, count(DISTINCT input->>'i')::int AS distinct FROM outlive.tasks`,
    finished: `SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS done,
                      count(*) FILTER (WHERE attempts <> 1)::int AS repeated,
                      count(*) FILTER (WHERE state <> 'succeeded')::int AS left
               FROM outlive.tasks`,
    schema: 'outlive',
    running: `SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'running'`,
    heldSince: OUTLIVE_HELD_SINCE,
  },
  'outlive-drop': {
    db: 'bench_outlive_drop',
    remaining: `SELECT count(*)::int AS n FROM outlive.tasks WHERE state IN ('pending', 'running')`,
    enqueued: `SELECT count(*)::int AS total, count(DISTINCT input->>'i')::int AS distinct FROM outlive.tasks`,
    // Succeeded rows are deleted, so after a drain every row is left over:
    // one not succeeded, or a success the settle kept (the option not
    // taking effect), which the check should catch as well.
    finished: `SELECT NULL::int AS done,
                      count(*) FILTER (WHERE attempts > 1)::int AS repeated,
                      count(*)::int AS left
               FROM outlive.tasks`,
    schema: 'outlive',
    running: `SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'running'`,
    heldSince: OUTLIVE_HELD_SINCE,
  },
  'graphile-worker': {
    db: 'bench_graphile',
    // Completed jobs are deleted; failed ones stay with a later run_at.
    remaining: `SELECT count(*)::int AS n FROM graphile_worker._private_jobs`,
    enqueued: `SELECT count(*)::int AS total, count(DISTINCT payload->>'i')::int AS distinct FROM graphile_worker._private_jobs`,
    finished: `SELECT NULL::int AS done,
                      count(*) FILTER (WHERE attempts > 1)::int AS repeated,
                      count(*)::int AS left
               FROM graphile_worker._private_jobs`,
    schema: 'graphile_worker',
    running: `SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE locked_at IS NOT NULL`,
    // A crashed worker's jobs stay locked for 4 hours.
    heldSince: null,
  },
  'pg-boss': {
    db: 'bench_pgboss',
    remaining: `SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'noop' AND state < 'completed'`,
    enqueued: `SELECT count(*)::int AS total, count(DISTINCT data->>'i')::int AS distinct FROM pgboss.job WHERE name = 'noop'`,
    finished: `SELECT count(*) FILTER (WHERE state = 'completed')::int AS done,
                      count(*) FILTER (WHERE retry_count > 0)::int AS repeated,
                      count(*) FILTER (WHERE state <> 'completed')::int AS left
               FROM pgboss.job WHERE name = 'noop'`,
    schema: 'pgboss',
    running: `SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'noop' AND state = 'active'`,
    heldSince: `SELECT count(*) FILTER (WHERE state = 'active' AND started_on < to_timestamp($1::float8 / 1000))::int AS held,
                       count(*) FILTER (WHERE state IN ('created', 'retry') OR (state = 'active' AND started_on >= to_timestamp($1::float8 / 1000)))::int AS again
                FROM pgboss.job WHERE name = 'noop'`,
  },
};
