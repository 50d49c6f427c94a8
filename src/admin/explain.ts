/**
 * Ask why: a run's tasks with their states, and for each task that is not
 * running or done, the reason it is where it is.
 */
import { parseId } from '../model/checks.js';
import { toExecutor, toPool, type Database } from '../db/executor.js';
import { nobodyRuns, readKnownTasks, type KnownTasks } from '../pass/known-tasks.js';
import { heldUntil } from '../pass/recover.js';
import type { RowLimit } from '../model/limits.js';
import type { RunState, TaskState } from '../model/states.js';
import { keyWait, progressText, readKeyStates, roomText, WAIT_COLUMNS, waitText, type KeyState, type TaskProgress, type WaitFacts } from './queries.js';

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
  /** What its attempt last said of its progress (`ctx.progress`), with when; null if it said nothing. */
  progress: TaskProgress | null;
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
SELECT t.id::text, t.step, t.name, t.state::text, t.attempts, t.max_attempts, t.run_at, t.timeout_ms, t.progress,
       ${heldUntil('t')} AS lease_expires_at, t.last_error,
       CASE WHEN t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.>) 0 THEN
         coalesce((SELECT pg_catalog.array_agg(p.step ORDER BY p.id)
                   FROM outlive.task_deps d JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
                   WHERE d.task_id OPERATOR(pg_catalog.=) t.id AND p.state OPERATOR(pg_catalog.<>) 'succeeded'), '{}')
       ELSE '{}' END AS waiting_for,
       t.queue, t.limits, t.blocked_on, qp.queue IS NOT NULL AS queue_paused, qp.reason AS queue_paused_reason, ${WAIT_COLUMNS}
FROM outlive.tasks t LEFT JOIN outlive.queue_pauses qp ON qp.queue OPERATOR(pg_catalog.=) t.queue
WHERE t.run_id OPERATOR(pg_catalog.=) $1 ORDER BY t.id`;

// One page of a run's steps in step order, from the run's (run_id, step)
// index: those after $2, starting with $3 when given, at most $4. The range
// on step keeps the index scan in order; starts_with drops what a collation
// sorts between the prefix's matches.
const STEPS_SQL = TASKS_SQL.replace(
  'WHERE t.run_id OPERATOR(pg_catalog.=) $1 ORDER BY t.id',
  `WHERE t.run_id OPERATOR(pg_catalog.=) $1 AND t.step IS NOT NULL
   AND t.step OPERATOR(pg_catalog.>) coalesce($2::text, '') AND t.step OPERATOR(pg_catalog.>=) coalesce($3::text, '')
   AND ($3::text IS NULL OR pg_catalog.starts_with(t.step, $3::text))
 ORDER BY t.step LIMIT $4`,
);

function list(names: string[]): string {
  const shown = names.slice(0, 5).map((n) => `"${n}"`).join(', ');
  return names.length > 5 ? `${shown} and ${names.length - 5} more` : shown;
}

/** The facts about one task row that say why it is where it is. */
export interface WhyFacts extends WaitFacts {
  max_attempts: number;
  timeout_ms: number;
  lease_expires_at: Date | null;
  last_error: string | null;
  waiting_for: string[];
  progress?: TaskProgress | null;
}

/**
 * Why a task is in its state, in words; `known` tells a ready task nobody can
 * run from one waiting its turn, and `held`, where given, says what of flow
 * control holds a ready task back (its queue's pause, one of its keys).
 */
export function why(t: WhyFacts, now: Date, known: KnownTasks, held: string | null = null): string {
  switch (t.state) {
    case 'pending':
      if (t.waiting_for.length > 0) return `waiting for ${list(t.waiting_for)} to succeed`;
      if (t.run_at > now) {
        const waiting = waitText(t, now);
        if (waiting) return waiting;
        return t.attempts > 0
          ? `backing off until ${t.run_at.toISOString()} after attempt ${t.attempts} of ${t.max_attempts} failed: ${t.last_error ?? 'unknown error'}`
          : `scheduled for ${t.run_at.toISOString()}`;
      }
      if (held !== null) return held;
      return nobodyRuns(t.name, known, t.timeout_ms) ?? 'ready: waiting for a pass to claim it';
    case 'running': {
      const done = progressText(t.progress);
      return `running attempt ${t.attempts} of ${t.max_attempts}${done ? ` (${done})` : ''}, lease until ${t.lease_expires_at?.toISOString() ?? 'unknown'}`;
    }
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

/** The facts of a task row that say whether flow control holds it back. */
interface FlowFacts {
  queue: string;
  limits: RowLimit[] | null;
  blocked_on: string | null;
  queue_paused: boolean;
  queue_paused_reason: string | null;
}

/** The most distinct keys one explanation looks up: a run of thousands of steps, each with a key of its own, stays one cheap read. */
const MAX_KEYS_EXPLAINED = 200;

/** A ready task that flow control holds back: the key the claim will find full or paused, if any. */
function ready(t: WhyFacts, now: Date): boolean {
  return t.state === 'pending' && t.waiting_for.length === 0 && t.run_at <= now;
}

/**
 * What holds back each ready task of a run that flow control governs: its
 * queue's pause, else the first of its keys (in the order the claim checks
 * them) that is paused, full or out of rate; a task last found waiting for
 * a key that has room now says when it is looked at again. Null for a task
 * nothing holds.
 */
async function heldBack(exec: ReturnType<typeof toExecutor>, rows: (WhyFacts & FlowFacts)[], now: Date): Promise<(string | null)[]> {
  // The key of each (key, what the task declares of it) the run's ready tasks hold, looked up once.
  const asked = new Map<string, { key: string; declared: RowLimit }>();
  const id = (l: RowLimit) => JSON.stringify([l.k, l.n ?? null, l.r ?? null, l.p ?? null, l.c ?? null]);
  // Keys tasks were found waiting for first, so the cap never drops those.
  const governed = rows.filter((r) => ready(r, now) && !r.queue_paused && r.limits);
  for (const pass of [true, false]) {
    for (const r of governed) {
      for (const l of r.limits!) {
        if (asked.size >= MAX_KEYS_EXPLAINED) break;
        if ((l.k === r.blocked_on) === pass) asked.set(id(l), { key: l.k, declared: l });
      }
    }
  }
  const states = new Map<string, KeyState>();
  const found = await readKeyStates(exec, [...asked.values()], { now });
  [...asked.keys()].forEach((k, i) => states.set(k, found[i]!));
  return rows.map((r) => {
    if (!ready(r, now)) return null;
    if (r.queue_paused) return `waiting: queue ${r.queue} is paused${r.queue_paused_reason ? `: ${r.queue_paused_reason}` : ''}`;
    if (!r.limits) return null;
    for (const l of r.limits) {
      const s = states.get(id(l));
      const wait = s ? keyWait(s) : null;
      if (wait) return `waiting: ${wait.text}`;
    }
    // Last found waiting for a key that has room now: when it is looked at again.
    const blocked = r.limits.find((l) => l.k === r.blocked_on);
    const s = blocked ? states.get(id(blocked)) : undefined;
    return s ? `waiting: ${roomText(s)}` : null;
  });
}

/** Lists a run's tasks with their states and, for each, why. Null if there is no such run. */
export async function explainRun(db: Database, runText: string, options: { now?: Date } = {}): Promise<ExplainedRun | null> {
  const runId = parseId('run', runText);
  if (runId === null) return null;
  const exec = toExecutor(toPool(db));
  const [run] = await exec.query<{
    id: string; name: string; state: RunState; error: string | null; failed_task_id: string | null; created_at: Date; finished_at: Date | null; now: Date;
  }>(RUN_SQL, [runId, options.now ?? null]);
  if (!run) return null;
  const rows = await exec.query<TaskRow>(TASKS_SQL, [runId]);
  const tasks = await explainRows(exec, rows, run.now);
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
    tasks,
  };
}

type TaskRow = { id: string; step: string | null; progress: TaskProgress | null } & WhyFacts & FlowFacts;

async function explainRows(exec: ReturnType<typeof toExecutor>, rows: TaskRow[], now: Date): Promise<ExplainedTask[]> {
  const known = await readKnownTasks(exec);
  const held = await heldBack(exec, rows, now);
  return rows.map((r, i) => ({
    id: r.id,
    step: r.step,
    name: r.name,
    state: r.state,
    attempts: r.attempts,
    maxAttempts: r.max_attempts,
    runAt: r.run_at,
    waitingFor: r.waiting_for,
    lastError: r.last_error,
    progress: r.progress,
    why: why(r, now, known, held[i] ?? null),
  }));
}

/** One page of a run's steps, explained; `next` is the step to continue after, null on the last page. */
export interface StepPage {
  steps: ExplainedTask[];
  next: string | null;
}

/**
 * A page of a run's steps in step order, each with why it is where it is:
 * those after the step `after`, whose step starts with `prefix` when given.
 * Reads the page's rows only (by the run's step index), however large the run.
 */
export async function explainSteps(
  db: Database,
  runId: string,
  options: { after?: string | null; prefix?: string | null; limit?: number; now?: Date } = {},
): Promise<StepPage> {
  const exec = toExecutor(toPool(db));
  const limit = options.limit ?? 100;
  const [clock] = await exec.query<{ now: Date }>(`SELECT coalesce($1::timestamptz, pg_catalog.now()) AS now`, [options.now ?? null]);
  const rows = await exec.query<TaskRow>(STEPS_SQL, [runId, options.after || null, options.prefix || null, limit + 1]);
  const more = rows.length > limit;
  if (more) rows.length = limit;
  return { steps: await explainRows(exec, rows, clock!.now), next: more ? rows.at(-1)!.step : null };
}
