/**
 * Read-only questions an operator asks of the rows: what is where, what is
 * stuck, what failed. The CLI and the dashboard share them, so both tell the
 * same story. Every function takes any {@link Database} (a pg or Neon pool).
 */
import { toExecutor, toPool, type Database, type Executor } from '../db/executor.js';
import type { ErrorEntry } from '../pass/execute.js';
import { nobodyRuns, readKnownTasks } from '../pass/known-tasks.js';
import { heldUntil } from '../pass/recover.js';
import { RUN_STATES, TASK_STATES, type RunState, type TaskState } from '../model/states.js';


function exec(db: Database): Executor {
  return toExecutor(toPool(db));
}

/** The whole system at a glance. */
export interface StatusReport {
  /** Tasks by state (every state present, zero when none). */
  tasks: Record<TaskState, number>;
  /** Tasks by queue, then state (only queues that have tasks). */
  queues: { queue: string; counts: Record<TaskState, number> }[];
  /** Runs by state. */
  runs: Record<RunState, number>;
  /** How long the oldest ready task (pending, due, not waiting on others) has been due, in ms; null if none. */
  oldestReadyMs: number | null;
  /** Tasks that failed for good in the last hour. */
  failedLastHour: number;
  /** Ready tasks, by name, that no pass which ran lately knows: they wait for a deploy (or a cancel). */
  unrunnable: { name: string; ready: number; why: string }[];
  now: Date;
}

function zeroes<S extends string>(states: readonly S[]): Record<S, number> {
  return Object.fromEntries(states.map((s) => [s, 0])) as Record<S, number>;
}

/** Counts by state and queue, the oldest ready task's wait, and the last hour's failures. */
export async function status(db: Database): Promise<StatusReport> {
  const q = exec(db);
  const [byQueue, runs, [extra], readyByName, known] = await Promise.all([
    q.query<{ queue: string; state: TaskState; n: number }>(
      `SELECT queue, state::text, pg_catalog.count(*)::int AS n FROM outlive.tasks GROUP BY 1, 2 ORDER BY 1, 2`,
    ),
    q.query<{ state: RunState; n: number }>(`SELECT state::text, pg_catalog.count(*)::int AS n FROM outlive.runs GROUP BY 1`),
    q.query<{ oldest_ms: number | null; failed_hour: number; now: Date }>(
      `SELECT (SELECT (extract(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(run_at)) OPERATOR(pg_catalog.*) 1000)::float8 FROM outlive.tasks
                 WHERE state OPERATOR(pg_catalog.=) 'pending' AND waiting_on OPERATOR(pg_catalog.=) 0
                   AND run_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS oldest_ms,
              (SELECT pg_catalog.count(*)::int FROM outlive.tasks
                 WHERE state OPERATOR(pg_catalog.=) 'failed'
                   AND finished_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour')) AS failed_hour,
              pg_catalog.now() AS now`,
    ),
    q.query<{ name: string; timeout_ms: number; n: number }>(
      `SELECT name, timeout_ms, pg_catalog.count(*)::int AS n FROM outlive.tasks
       WHERE state OPERATOR(pg_catalog.=) 'pending' AND waiting_on OPERATOR(pg_catalog.=) 0 AND run_at OPERATOR(pg_catalog.<=) pg_catalog.now()
       GROUP BY 1, 2 ORDER BY 1, 2`,
    ),
    readKnownTasks(q),
  ]);
  // Rows of one name may differ only in their timeouts; those no pass can
  // give are counted together, under the reason given for the longest.
  const unrunnable: StatusReport['unrunnable'] = [];
  for (const r of readyByName) {
    const why = nobodyRuns(r.name, known, r.timeout_ms);
    if (!why) continue;
    const last = unrunnable.at(-1);
    if (last?.name === r.name) {
      last.ready += r.n;
      last.why = why;
    } else unrunnable.push({ name: r.name, ready: r.n, why });
  }
  const tasks = zeroes(TASK_STATES);
  const queues = new Map<string, Record<TaskState, number>>();
  for (const r of byQueue) {
    tasks[r.state] += r.n;
    if (!queues.has(r.queue)) queues.set(r.queue, zeroes(TASK_STATES));
    queues.get(r.queue)![r.state] = r.n;
  }
  const runCounts = zeroes(RUN_STATES);
  for (const r of runs) runCounts[r.state] = r.n;
  return {
    tasks,
    queues: [...queues].map(([queue, counts]) => ({ queue, counts })),
    runs: runCounts,
    oldestReadyMs: extra!.oldest_ms === null ? null : Math.round(extra!.oldest_ms),
    failedLastHour: extra!.failed_hour,
    unrunnable,
    now: extra!.now,
  };
}

/** One task as a list shows it. */
export interface TaskSummary {
  id: string;
  name: string;
  queue: string;
  state: TaskState;
  attempts: number;
  maxAttempts: number;
  runId: string | null;
  step: string | null;
  runAt: Date;
  createdAt: Date;
  finishedAt: Date | null;
  lastError: string | null;
}

/** Filters of {@link listTasks}; all optional. */
export interface TaskFilter {
  state?: TaskState;
  name?: string;
  queue?: string;
  runId?: string;
  limit?: number;
  /** Newest finished first (for failures) instead of newest created first. */
  byFinished?: boolean;
}

const TASK_COLUMNS = `id::text, name, queue, state::text, attempts, max_attempts, run_id::text, step, run_at, created_at, finished_at, last_error`;

function toSummary(r: Record<string, unknown>): TaskSummary {
  return {
    id: r.id as string,
    name: r.name as string,
    queue: r.queue as string,
    state: r.state as TaskState,
    attempts: r.attempts as number,
    maxAttempts: r.max_attempts as number,
    runId: (r.run_id as string | null) ?? null,
    step: (r.step as string | null) ?? null,
    runAt: r.run_at as Date,
    createdAt: r.created_at as Date,
    finishedAt: (r.finished_at as Date | null) ?? null,
    lastError: (r.last_error as string | null) ?? null,
  };
}

/** Lists tasks, newest first, filtered by state, name, queue or run. */
export async function listTasks(db: Database, filter: TaskFilter = {}): Promise<TaskSummary[]> {
  const rows = await exec(db).query(
    `SELECT ${TASK_COLUMNS} FROM outlive.tasks
     WHERE ($1::text IS NULL OR state::text OPERATOR(pg_catalog.=) $1) AND ($2::text IS NULL OR name OPERATOR(pg_catalog.=) $2)
       AND ($3::text IS NULL OR queue OPERATOR(pg_catalog.=) $3) AND ($4::bigint IS NULL OR run_id OPERATOR(pg_catalog.=) $4)
     ORDER BY ${filter.byFinished ? 'outlive.tasks.finished_at DESC NULLS LAST, outlive.tasks.id DESC' : 'outlive.tasks.id DESC'} LIMIT $5`,
    [filter.state ?? null, filter.name ?? null, filter.queue ?? null, filter.runId ?? null, filter.limit ?? 50],
  );
  return rows.map(toSummary);
}

/** The failures, newest first. */
export function listFailures(db: Database, limit = 20): Promise<TaskSummary[]> {
  return listTasks(db, { state: 'failed', limit, byFinished: true });
}

/** One task with everything the rows know about it. */
export interface TaskDetail extends TaskSummary {
  priority: number;
  input: unknown;
  output: unknown;
  timeoutMs: number;
  key: string | null;
  leaseOwner: string | null;
  leaseExpiresAt: Date | null;
  startedAt: Date | null;
  updatedAt: Date;
  /** Every failed attempt, oldest first. */
  errors: ErrorEntry[];
  /** Steps this task waits for, with their states. */
  dependsOn: { id: string; step: string | null; state: TaskState }[];
}

/** One task in full; null if there is no such task. */
export async function getTask(db: Database, id: string): Promise<TaskDetail | null> {
  const q = exec(db);
  const [row] = await q.query(
    `SELECT ${TASK_COLUMNS}, priority, input, output, timeout_ms, key, lease_owner, ${heldUntil('t')} AS lease_expires_at,
            started_at, updated_at, errors
     FROM outlive.tasks t WHERE id OPERATOR(pg_catalog.=) $1`,
    [id],
  );
  if (!row) return null;
  const deps = await q.query<{ id: string; step: string | null; state: TaskState }>(
    `SELECT p.id::text, p.step, p.state::text FROM outlive.task_deps d JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
     WHERE d.task_id OPERATOR(pg_catalog.=) $1 ORDER BY p.id`,
    [id],
  );
  return {
    ...toSummary(row),
    priority: row.priority as number,
    input: row.input,
    output: row.output ?? null,
    timeoutMs: row.timeout_ms as number,
    key: (row.key as string | null) ?? null,
    leaseOwner: (row.lease_owner as string | null) ?? null,
    leaseExpiresAt: (row.lease_expires_at as Date | null) ?? null,
    startedAt: (row.started_at as Date | null) ?? null,
    updatedAt: row.updated_at as Date,
    errors: (row.errors as ErrorEntry[] | null) ?? [],
    dependsOn: deps,
  };
}

/** One run as a list shows it, with its progress. */
export interface RunSummary {
  id: string;
  name: string;
  state: RunState;
  /** Tasks finished (succeeded, failed, cancelled or skipped). */
  done: number;
  total: number;
  succeeded: number;
  failed: number;
  error: string | null;
  createdAt: Date;
  finishedAt: Date | null;
}

/** Lists runs, newest first, with how many of their tasks are done. */
export async function listRuns(db: Database, filter: { state?: RunState; limit?: number } = {}): Promise<RunSummary[]> {
  const rows = await exec(db).query<{
    id: string; name: string; state: RunState; error: string | null; created_at: Date; finished_at: Date | null;
    total: number; done: number; succeeded: number; failed: number;
  }>(
    `SELECT r.id::text, r.name, r.state::text, r.error, r.created_at, r.finished_at,
            coalesce(c.total, 0) AS total, coalesce(c.done, 0) AS done, coalesce(c.succeeded, 0) AS succeeded, coalesce(c.failed, 0) AS failed
     FROM (SELECT * FROM outlive.runs WHERE ($1::text IS NULL OR state::text OPERATOR(pg_catalog.=) $1) ORDER BY id DESC LIMIT $2) r
     LEFT JOIN LATERAL (
       SELECT pg_catalog.count(*)::int AS total,
              pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running']::outlive.task_state[]))::int AS done,
              pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'succeeded')::int AS succeeded,
              pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'failed')::int AS failed
       FROM outlive.tasks t WHERE t.run_id OPERATOR(pg_catalog.=) r.id) c ON true
     ORDER BY r.id DESC`,
    [filter.state ?? null, filter.limit ?? 50],
  );
  return rows.map((r) => ({
    id: r.id, name: r.name, state: r.state, done: r.done, total: r.total, succeeded: r.succeeded, failed: r.failed,
    error: r.error, createdAt: r.created_at, finishedAt: r.finished_at,
  }));
}

/** The dependency edges among a run's tasks: `task` waits for `dependsOn`. */
export async function runEdges(db: Database, runId: string): Promise<{ task: string; dependsOn: string }[]> {
  return exec(db).query<{ task: string; dependsOn: string }>(
    `SELECT d.task_id::text AS task, d.depends_on::text AS "dependsOn"
     FROM outlive.task_deps d JOIN outlive.tasks t ON t.id OPERATOR(pg_catalog.=) d.task_id WHERE d.run_id OPERATOR(pg_catalog.=) $1`,
    [runId],
  );
}

/** Tasks finished per minute over the last `minutes` minutes, oldest first (every minute present). */
export async function finishedPerMinute(db: Database, minutes = 60): Promise<{ minute: Date; succeeded: number; failed: number }[]> {
  return exec(db).query<{ minute: Date; succeeded: number; failed: number }>(
    `SELECT m.minute, coalesce(c.succeeded, 0) AS succeeded, coalesce(c.failed, 0) AS failed
     FROM pg_catalog.generate_series(
            pg_catalog.date_trunc('minute', pg_catalog.now()) OPERATOR(pg_catalog.-) (($1::int OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) interval '1 minute'),
            pg_catalog.date_trunc('minute', pg_catalog.now()), interval '1 minute') AS m(minute)
     LEFT JOIN (
       SELECT pg_catalog.date_trunc('minute', finished_at) AS minute,
              pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'succeeded')::int AS succeeded,
              pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'failed')::int AS failed
       FROM outlive.tasks
       WHERE finished_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) ($1::int OPERATOR(pg_catalog.*) interval '1 minute'))
       GROUP BY 1) c ON c.minute OPERATOR(pg_catalog.=) m.minute
     ORDER BY m.minute`,
    [minutes],
  );
}

/** One schedule, with its last and next firing. */
export interface ScheduleSummary {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  lastSlot: Date | null;
  lastFiredAt: Date | null;
  nextSlot: Date;
}

/** The schedules the cron tick and workers have registered. */
export async function listSchedules(db: Database): Promise<ScheduleSummary[]> {
  const rows = await exec(db).query<{
    name: string; cron: string; timezone: string; task: string; last_slot: Date | null; last_fired_at: Date | null; next_slot: Date;
  }>(`SELECT name, cron, timezone, task, last_slot, last_fired_at, next_slot FROM outlive.schedules ORDER BY name`);
  return rows.map((r) => ({
    name: r.name, cron: r.cron, timezone: r.timezone, task: r.task, lastSlot: r.last_slot, lastFiredAt: r.last_fired_at, nextSlot: r.next_slot,
  }));
}
