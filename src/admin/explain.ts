/**
 * Ask why: a run's tasks with their states, and for each task that is not
 * running or done, the reason it is where it is.
 */
import { toExecutor, toPool, type Database } from '../db/executor.js';
import { nobodyRuns, readKnownTasks, type KnownTasks } from '../pass/known-tasks.js';
import { heldUntil } from '../pass/recover.js';
import type { RunState, TaskState } from '../model/states.js';

/** One task of a run, explained. */
export interface ExplainedTask {
  id: string;
  step: string | null;
  name: string;
  state: TaskState;
  attempts: number;
  maxAttempts: number;
  runAt: Date;
  /** Steps it still waits for (pending tasks only). */
  waitingFor: string[];
  lastError: string | null;
  /** In words: why the task is in this state. */
  why: string;
}

/** A run, explained. */
export interface ExplainedRun {
  id: string;
  name: string;
  state: RunState;
  error: string | null;
  failedTaskId: string | null;
  createdAt: Date;
  finishedAt: Date | null;
  counts: Partial<Record<TaskState, number>>;
  tasks: ExplainedTask[];
}

const RUN_SQL = `
SELECT id::text, name, state::text, error, failed_task_id::text, created_at, finished_at, coalesce($2::timestamptz, pg_catalog.now()) AS now
FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`;

const TASKS_SQL = `
SELECT t.id::text, t.step, t.name, t.state::text, t.attempts, t.max_attempts, t.run_at, t.timeout_ms,
       ${heldUntil('t')} AS lease_expires_at, t.last_error,
       CASE WHEN t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.>) 0 THEN
         coalesce((SELECT pg_catalog.array_agg(p.step ORDER BY p.id)
                   FROM outlive.task_deps d JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
                   WHERE d.task_id OPERATOR(pg_catalog.=) t.id AND p.state OPERATOR(pg_catalog.<>) 'succeeded'), '{}')
       ELSE '{}' END AS waiting_for
FROM outlive.tasks t WHERE t.run_id OPERATOR(pg_catalog.=) $1 ORDER BY t.id`;

function list(names: string[]): string {
  const shown = names.slice(0, 5).map((n) => `"${n}"`).join(', ');
  return names.length > 5 ? `${shown} and ${names.length - 5} more` : shown;
}

/** The facts about one task row that say why it is where it is. */
export interface WhyFacts {
  name: string;
  state: TaskState;
  attempts: number;
  max_attempts: number;
  run_at: Date;
  timeout_ms: number;
  lease_expires_at: Date | null;
  last_error: string | null;
  waiting_for: string[];
}

/** Why a task is in its state, in words; `known` tells a ready task nobody can run from one waiting its turn. */
export function why(t: WhyFacts, now: Date, known: KnownTasks): string {
  switch (t.state) {
    case 'pending':
      if (t.waiting_for.length > 0) return `waiting for ${list(t.waiting_for)} to succeed`;
      if (t.run_at > now) {
        return t.attempts > 0
          ? `backing off until ${t.run_at.toISOString()} after attempt ${t.attempts} of ${t.max_attempts} failed: ${t.last_error ?? 'unknown error'}`
          : `scheduled for ${t.run_at.toISOString()}`;
      }
      return nobodyRuns(t.name, known, t.timeout_ms) ?? 'ready: waiting for a pass to claim it';
    case 'running':
      return `running attempt ${t.attempts} of ${t.max_attempts}, lease until ${t.lease_expires_at?.toISOString() ?? 'unknown'}`;
    case 'succeeded':
      return `succeeded on attempt ${t.attempts}`;
    case 'failed':
      return `failed after ${t.attempts} attempt${t.attempts === 1 ? '' : 's'}: ${t.last_error ?? 'unknown error'}`;
    case 'skipped':
      return t.last_error ?? 'not run: an upstream task did not succeed';
    case 'cancelled':
      return t.last_error && t.last_error !== 'cancelled' ? `cancelled: ${t.last_error}` : 'cancelled';
  }
}

/** Lists a run's tasks with their states and, for each, why. Null if there is no such run. */
export async function explainRun(db: Database, runId: string, options: { now?: Date } = {}): Promise<ExplainedRun | null> {
  const exec = toExecutor(toPool(db));
  const [run] = await exec.query<{
    id: string; name: string; state: RunState; error: string | null; failed_task_id: string | null; created_at: Date; finished_at: Date | null; now: Date;
  }>(RUN_SQL, [runId, options.now ?? null]);
  if (!run) return null;
  const rows = await exec.query<{
    id: string; step: string | null; name: string; state: TaskState; attempts: number; max_attempts: number; run_at: Date;
    timeout_ms: number; lease_expires_at: Date | null; last_error: string | null; waiting_for: string[];
  }>(TASKS_SQL, [runId]);
  const known = await readKnownTasks(exec);
  const counts: Partial<Record<TaskState, number>> = {};
  for (const r of rows) counts[r.state] = (counts[r.state] ?? 0) + 1;
  return {
    id: run.id,
    name: run.name,
    state: run.state,
    error: run.error,
    failedTaskId: run.failed_task_id,
    createdAt: run.created_at,
    finishedAt: run.finished_at,
    counts,
    tasks: rows.map((r) => ({
      id: r.id,
      step: r.step,
      name: r.name,
      state: r.state,
      attempts: r.attempts,
      maxAttempts: r.max_attempts,
      runAt: r.run_at,
      waitingFor: r.waiting_for,
      lastError: r.last_error,
      why: why(r, run.now, known),
    })),
  };
}
