/**
 * Read-only questions an operator asks of the rows: what is where, what is
 * stuck, what failed. The CLI and the dashboard share them, so both tell the
 * same story. Every function takes any {@link Database} (a pg or Neon pool).
 */
import { METRICS_STATEMENTS, metricsParams } from './metrics.js';
import { parseId } from '../model/checks.js';
import { WAIT_TASK } from '../model/wait.js';
import { MAX_SNOOZES } from '../model/task.js';
import { toExecutor, toPool, type Database, type Executor } from '../db/executor.js';
import type { ErrorEntry } from '../pass/execute.js';
import { nobodyRuns, readKnownTasks } from '../pass/known-tasks.js';
import { heldUntil } from '../pass/recover.js';
import { RUN_STATES, TASK_STATES, type RunState, type TaskState } from '../model/states.js';
import type { RowLimit } from '../model/limits.js';
import type { Progress } from '../model/task.js';


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
  /**
   * The keys that hold tasks back (at most 50): those tasks wait for, and
   * those paused, each with why (its pause, its concurrency or its rate;
   * null when it has room again) and how many tasks wait.
   */
  waits: { key: string; waiting: number; waitingMore: boolean; wait: KeyWait | null; state: KeyState }[];
  /** Paused queues: no claim takes their tasks. */
  pausedQueues: QueuePause[];
  /**
   * With `cap`: the states (of tasks, of runs) whose counts stopped at the
   * cap, so there are more ("10000+"); the queues' counts of finished states
   * are not read then (0), nor the ready tasks beyond the cap by name.
   */
  more?: { tasks: TaskState[]; runs: RunState[] };
  now: Date;
}

/** A queue's unfinished tasks, counted from the indexes of live rows (those the claim reads), up to a cap. */
export interface QueueDepth {
  queue: string;
  /** Pending tasks the live rows' indexes hold (a run's steps still waiting on others are in none: not counted). */
  pending: number;
  running: number;
  /** True when a count stopped at the cap. */
  pendingMore: boolean;
  runningMore: boolean;
  /** When its oldest ready task (pending, not waiting for others) became due; null if none is. */
  oldestReadyAt: Date | null;
}

/** Each queue with unfinished tasks: pending and running counted up to `cap`, and when its oldest ready task became due. */
export async function queueDepths(db: Database, options: { cap?: number; limit?: number; now?: Date } = {}): Promise<QueueDepth[]> {
  return readQueueDepths(exec(db), options.cap ?? COUNT_CAP, options.limit ?? 100, options.now ?? null);
}

// The metrics' statement of live rows (src/admin/metrics.ts): an index of
// unfinished rows of its own would cost every task an entry at its enqueue
// and its claim (docs/benchmarks.md, "The dashboard at scale").
async function readQueueDepths(q: Executor, cap: number, limit: number, now: Date | null): Promise<QueueDepth[]> {
  const rows = await q.query<{ queue: string; ready: number; scheduled: number; running: number; waiting: number; lag_seconds: number; now_at: Date }>(
    METRICS_STATEMENTS.depth,
    metricsParams(now ? { now } : {}).depth,
  );
  const at = (now ?? new Date()).getTime();
  return rows
    .sort((a, b) => (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0))
    .slice(0, limit)
    .map((r) => {
      const pending = r.ready + r.scheduled + r.waiting;
      return {
        queue: r.queue,
        pending: Math.min(pending, cap),
        running: Math.min(r.running, cap),
        pendingMore: pending > cap,
        runningMore: r.running > cap,
        oldestReadyAt: r.ready > 0 ? new Date(at - r.lag_seconds * 1000) : null,
      };
    });
}

/**
 * Tasks finished per queue in the last hour, from tasks_state_finished_idx:
 * at most `cap` rows read, `more` when there were more.
 */
export async function finishedByQueue(db: Database, options: { cap?: number } = {}): Promise<{ queue: string; succeeded: number; failed: number; more: boolean }[]> {
  const cap = options.cap ?? COUNT_CAP;
  const rows = await exec(db).query<{ queue: string; succeeded: number; failed: number; seen: number }>(
    `SELECT r.queue, pg_catalog.count(*) FILTER (WHERE r.state OPERATOR(pg_catalog.=) 'succeeded')::int AS succeeded,
            pg_catalog.count(*) FILTER (WHERE r.state OPERATOR(pg_catalog.=) 'failed')::int AS failed,
            pg_catalog.sum(pg_catalog.count(*)) OVER ()::int AS seen
     FROM (SELECT t.queue, t.state FROM outlive.tasks t
           WHERE t.state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'failed']::outlive.task_state[])
             AND t.finished_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour') LIMIT $1) r
     GROUP BY 1 ORDER BY 1`,
    [cap + 1],
  );
  return rows.map((r) => ({ queue: r.queue, succeeded: r.succeeded, failed: r.failed, more: r.seen > cap }));
}

/** Waits parked for a signal, per queue, from tasks_wait_idx: at most `cap` read. */
export async function parkedWaits(db: Database, options: { cap?: number } = {}): Promise<{ queue: string; n: number; more: boolean }[]> {
  const cap = options.cap ?? COUNT_CAP;
  const rows = await exec(db).query<{ queue: string; n: number; seen: number }>(
    `SELECT r.queue, pg_catalog.count(*)::int AS n, pg_catalog.sum(pg_catalog.count(*)) OVER ()::int AS seen
     FROM (SELECT t.queue FROM outlive.tasks t WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.wait_key IS NOT NULL LIMIT $1) r
     GROUP BY 1 ORDER BY 1`,
    [cap + 1],
  );
  return rows.map((r) => ({ queue: r.queue, n: r.n, more: r.seen > cap }));
}

/** Where the dashboard stops counting: "10000+". */
export const COUNT_CAP = 10_000;

// Finished tasks by state, each counted up to $1 from tasks_state_finished_idx;
// runs by state up to $1; failures of the last hour up to $1.
const BOUNDED_COUNTS_SQL = `
SELECT 'task' AS of, s.state::text,
       (SELECT pg_catalog.count(*)::int FROM (SELECT 1 FROM outlive.tasks t
          WHERE t.state OPERATOR(pg_catalog.=) s.state AND t.finished_at IS NOT NULL LIMIT $1) x) AS n
FROM pg_catalog.unnest(ARRAY['succeeded', 'failed', 'cancelled', 'skipped']::outlive.task_state[]) AS s(state)
UNION ALL
SELECT 'run', s.state::text,
       (SELECT pg_catalog.count(*)::int FROM (SELECT 1 FROM outlive.runs r WHERE r.state OPERATOR(pg_catalog.=) s.state LIMIT $1) x)
FROM pg_catalog.unnest(pg_catalog.enum_range(NULL::outlive.run_state)) AS s(state)
UNION ALL
SELECT 'failed-hour', NULL,
       (SELECT pg_catalog.count(*)::int FROM (SELECT 1 FROM outlive.tasks t
          WHERE t.state OPERATOR(pg_catalog.=) 'failed' AND t.finished_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour') LIMIT $1) x)`;

/**
 * {@link status} read from indexes only, whatever the history's size: every
 * count stops at `cap` (the states that reached it are in `more`), the
 * queues and their pending and running come from the indexes of live rows
 * (steps of runs still waiting on others are in none, so not in `pending`),
 * and their counts of finished states are left at 0.
 */
async function boundedStatus(q: Executor, cap: number): Promise<StatusReport> {
  const [depths, counts, readyByName, known, waited, paused, [clock]] = await Promise.all([
    readQueueDepths(q, cap, 1000, null),
    q.query<{ of: 'task' | 'run' | 'failed-hour'; state: string | null; n: number }>(BOUNDED_COUNTS_SQL, [cap + 1]),
    q.query<{ name: string; timeout_ms: number; n: number }>(
      `SELECT r.name, r.timeout_ms, pg_catalog.count(*)::int AS n FROM (
         SELECT t.name, t.timeout_ms FROM outlive.tasks t
         WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.=) 0 AND t.run_at OPERATOR(pg_catalog.<=) pg_catalog.now()
         LIMIT $1) r
       GROUP BY 1, 2 ORDER BY 1, 2`,
      [cap],
    ),
    readKnownTasks(q),
    readWaitedKeys(q, { limit: 50 }),
    readPausedQueues(q),
    q.query<{ now: Date }>(`SELECT pg_catalog.now() AS now`),
  ]);
  const tasks = zeroes(TASK_STATES);
  const runs = zeroes(RUN_STATES);
  const more: NonNullable<StatusReport['more']> = { tasks: [], runs: [] };
  const queues: StatusReport['queues'] = [];
  let oldest: Date | null = null;
  for (const d of depths) {
    queues.push({ queue: d.queue, counts: { ...zeroes(TASK_STATES), pending: d.pending, running: d.running } });
    tasks.pending += d.pending;
    tasks.running += d.running;
    if (d.pendingMore && !more.tasks.includes('pending')) more.tasks.push('pending');
    if (d.runningMore && !more.tasks.includes('running')) more.tasks.push('running');
    if (d.oldestReadyAt && (oldest === null || d.oldestReadyAt < oldest)) oldest = d.oldestReadyAt;
  }
  let failedLastHour = 0;
  for (const c of counts) {
    const n = Math.min(c.n, cap);
    if (c.of === 'task') {
      tasks[c.state as TaskState] = n;
      if (c.n > cap) more.tasks.push(c.state as TaskState);
    } else if (c.of === 'run') {
      runs[c.state as RunState] = n;
      if (c.n > cap) more.runs.push(c.state as RunState);
    } else failedLastHour = n;
  }
  return {
    tasks,
    queues,
    runs,
    oldestReadyMs: oldest === null ? null : Math.max(0, clock!.now.getTime() - oldest.getTime()),
    failedLastHour,
    unrunnable: unrunnableOf(readyByName, known),
    waits: waited.map((state) => ({ key: state.key, waiting: state.waiting, waitingMore: state.waitingMore, wait: keyWait(state), state })),
    pausedQueues: paused,
    more,
    now: clock!.now,
  };
}

// Rows of one name may differ only in their timeouts; those no pass can
// give are counted together, under the reason given for the longest.
function unrunnableOf(readyByName: { name: string; timeout_ms: number; n: number }[], known: Awaited<ReturnType<typeof readKnownTasks>>): StatusReport['unrunnable'] {
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
  return unrunnable;
}

function zeroes<S extends string>(states: readonly S[]): Record<S, number> {
  return Object.fromEntries(states.map((s) => [s, 0])) as Record<S, number>;
}

/**
 * Counts by state and queue, the oldest ready task's wait, and the last
 * hour's failures. Exact, by reading every row; with `cap`, from indexes
 * only, each count stopping at the cap (see {@link StatusReport.more}), and
 * `pending` without the steps of runs still waiting on others.
 */
export async function status(db: Database, options: { cap?: number } = {}): Promise<StatusReport> {
  const q = exec(db);
  if (options.cap !== undefined) return boundedStatus(q, options.cap);
  const [byQueue, runs, [extra], readyByName, known, waited, paused] = await Promise.all([
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
    readWaitedKeys(q, { limit: 50 }),
    readPausedQueues(q),
  ]);
  const unrunnable = unrunnableOf(readyByName, known);
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
    waits: waited.map((state) => ({ key: state.key, waiting: state.waiting, waitingMore: state.waitingMore, wait: keyWait(state), state })),
    pausedQueues: paused,
    now: extra!.now,
  };
}

/** A task's last progress, as `ctx.progress` wrote it. */
export type TaskProgress = Progress & { at: string };

/** Progress in words: "120 of 1000 pages", "120", "importing". */
export function progressText(p: TaskProgress | null | undefined): string | null {
  if (!p) return null;
  const count = p.done === undefined ? '' : p.total === undefined ? `${p.done}` : `${p.done} of ${p.total}`;
  return [count, p.note ?? ''].filter((x) => x !== '').join(' ') || null;
}

/** The facts of a pending row that say what it waits for on its own: a signal, a time, a snooze. */
export interface WaitFacts {
  name: string;
  state: TaskState;
  run_at: Date;
  attempts: number;
  snoozes: number;
  wait_key: string | null;
  /** The attempt of its last error, or null: a snooze writes none. */
  last_error_attempt: number | null;
}

/** The columns {@link WaitFacts} reads, for a query of `outlive.tasks` as `t`. */
export const WAIT_COLUMNS = `t.snoozes, t.wait_key, (t.errors OPERATOR(pg_catalog.->) (pg_catalog.jsonb_array_length(t.errors) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.->>) 'attempt')::int AS last_error_attempt`;

/**
 * What a pending row waits for until its time, in words: "waiting for signal
 * dns:example.com until ...", "sleeping until ...", "snoozed until ... (3 of
 * 1000)"; null for a row that is due, or backing off after a failure.
 */
export function waitText(t: WaitFacts, now: Date): string | null {
  if (t.state !== 'pending' || t.run_at <= now) return null;
  const until = t.run_at.toISOString();
  if (t.name === WAIT_TASK) return t.wait_key !== null ? `waiting for signal ${t.wait_key} until ${until}` : `sleeping until ${until}`;
  if (t.snoozes > 0 && t.attempts > 0 && t.last_error_attempt !== t.attempts) return `snoozed until ${until} (${t.snoozes} of ${MAX_SNOOZES})`;
  return null;
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

/** The columns {@link toSummary} reads, for a query of outlive.tasks. */
export const TASK_COLUMNS = `id::text, name, queue, state::text, attempts, max_attempts, run_id::text, step, run_at, created_at, finished_at, last_error`;

/** A row of {@link TASK_COLUMNS} as a {@link TaskSummary}. */
export function toSummary(r: Record<string, unknown>): TaskSummary {
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

/** The failures, newest first: a backward walk of tasks_state_finished_idx, however long the history. */
export async function listFailures(db: Database, limit = 20): Promise<TaskSummary[]> {
  const rows = await exec(db).query(
    `SELECT ${TASK_COLUMNS} FROM outlive.tasks
     WHERE state OPERATOR(pg_catalog.=) 'failed' AND finished_at IS NOT NULL
     ORDER BY finished_at DESC, id DESC LIMIT $1`,
    [limit],
  );
  return rows.map(toSummary);
}

/** One task with everything the rows know about it. */
export interface TaskDetail extends TaskSummary {
  priority: number;
  input: unknown;
  output: unknown;
  timeoutMs: number;
  /** Attempts its passes cut short (died, lost the lease): run again without counting against `maxAttempts`, which grew by as many. */
  interruptions: number;
  /** What its attempt last said of its progress (`ctx.progress`), with when. */
  progress: TaskProgress | null;
  /** What it waits for until its time (a signal, a time, a snooze), in words; null if nothing. */
  waiting: string | null;
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
export async function getTask(db: Database, taskId: string): Promise<TaskDetail | null> {
  const id = parseId('task', taskId);
  if (id === null) return null;
  const q = exec(db);
  const [row] = await q.query(
    `SELECT ${TASK_COLUMNS}, priority, input, output, timeout_ms, interruptions, progress, key, lease_owner, ${heldUntil('t')} AS lease_expires_at,
            started_at, updated_at, errors, ${WAIT_COLUMNS}, pg_catalog.now() AS now
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
    interruptions: row.interruptions as number,
    progress: (row.progress as TaskProgress | null) ?? null,
    waiting: waitText(row as unknown as WaitFacts, row.now as Date),
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
  /** Tasks not yet finished, from the run's row: exact even when the counts above stopped at `cap`. */
  unfinished: number;
  /** The run has more than `cap` tasks: `total` is the cap, and `done`, `succeeded` and `failed` are of an arbitrary `cap` of them. */
  capped: boolean;
  error: string | null;
  createdAt: Date;
  finishedAt: Date | null;
}

/**
 * Lists runs, newest first, with how many of their tasks are done: those
 * before the run `before` (a keyset page), of a state, of a name. With
 * `cap`, each run's tasks are counted up to the cap (a page of twenty runs
 * of 100,000 steps would read 2,000,000 rows); its unfinished count, from
 * its row, is exact either way.
 */
export async function listRuns(db: Database, filter: { state?: RunState; name?: string; before?: string | null; limit?: number; cap?: number } = {}): Promise<RunSummary[]> {
  const rows = await exec(db).query<{
    id: string; name: string; state: RunState; error: string | null; created_at: Date; finished_at: Date | null; unfinished: number;
    total: number; done: number; succeeded: number; failed: number;
  }>(
    `SELECT r.id::text, r.name, r.state::text, r.error, r.created_at, r.finished_at, greatest(r.unfinished, 0) AS unfinished,
            coalesce(c.total, 0) AS total, coalesce(c.done, 0) AS done, coalesce(c.succeeded, 0) AS succeeded, coalesce(c.failed, 0) AS failed
     FROM (SELECT * FROM outlive.runs WHERE ($1::text IS NULL OR state::text OPERATOR(pg_catalog.=) $1) AND ($3::text IS NULL OR name OPERATOR(pg_catalog.=) $3)
             AND ($4::bigint IS NULL OR id OPERATOR(pg_catalog.<) $4) ORDER BY id DESC LIMIT $2) r
     LEFT JOIN LATERAL (
       SELECT pg_catalog.count(*)::int AS total,
              pg_catalog.count(*) FILTER (WHERE t.state OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running']::outlive.task_state[]))::int AS done,
              pg_catalog.count(*) FILTER (WHERE t.state OPERATOR(pg_catalog.=) 'succeeded')::int AS succeeded,
              pg_catalog.count(*) FILTER (WHERE t.state OPERATOR(pg_catalog.=) 'failed')::int AS failed
       FROM (SELECT t.state FROM outlive.tasks t WHERE t.run_id OPERATOR(pg_catalog.=) r.id LIMIT $5::int OPERATOR(pg_catalog.+) 1) t) c ON true
     ORDER BY r.id DESC`,
    [filter.state ?? null, filter.limit ?? 50, filter.name || null, filter.before || null, filter.cap ?? null],
  );
  return rows.map((r) => {
    const capped = filter.cap !== undefined && r.total > filter.cap;
    return {
      id: r.id, name: r.name, state: r.state, done: r.done, total: capped ? filter.cap! : r.total, succeeded: r.succeeded, failed: r.failed,
      unfinished: r.unfinished, capped, error: r.error, createdAt: r.created_at, finishedAt: r.finished_at,
    };
  });
}

/** The dependency edges among a run's tasks: `task` waits for `dependsOn`. */
export async function runEdges(db: Database, runId: string): Promise<{ task: string; dependsOn: string }[]> {
  const id = parseId('run', runId);
  if (id === null) return [];
  return exec(db).query<{ task: string; dependsOn: string }>(
    `SELECT d.task_id::text AS task, d.depends_on::text AS "dependsOn"
     FROM outlive.task_deps d JOIN outlive.tasks t ON t.id OPERATOR(pg_catalog.=) d.task_id WHERE d.run_id OPERATOR(pg_catalog.=) $1`,
    [id],
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
       -- The states name tasks_state_finished_idx's leading column, so only the window's entries are read.
       WHERE state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'failed']::outlive.task_state[])
         AND finished_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) ($1::int OPERATOR(pg_catalog.*) interval '1 minute'))
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

// ---------------------------------------------------------------------------
// Flow control as an operator sees it (issue 26): where each key stands, why
// tasks wait for one, which queues are paused. Cheap on purpose: the keys come
// from outlive.limits (one row per key) or from the partial index of waiting
// tasks (tasks_blocked_idx), and waiting tasks are counted up to a cap, never
// over the whole table.

/** How many waiting tasks of one key are counted; past it a count reads "at least". */
export const WAITING_CAP = 10_000;

/** Where a key stands now. */
export interface KeyState {
  key: string;
  /** False when the key has no row yet: no task of it was ever looked at by a claim, nor was it paused or set. */
  known: boolean;
  /** Tasks holding a slot of the key. */
  running: number;
  /** The concurrency in force: the override (setLimit), else what its tasks declare; null when it has none. */
  concurrency: number | null;
  /** True when `concurrency` is an override set at run time. */
  concurrencySet: boolean;
  /** The rate in force, overridden or declared (its burst as declared, when below the limit); null when it has none. */
  rate: { limit: number; periodMs: number; burst?: number } | null;
  rateSet: boolean;
  /** What the starts of the last period count against the rate; null without a rate. */
  windowUsed: number | null;
  /** What the next start of the key costs (its first waiting task's, else 1). */
  nextCost: number;
  /** When the next start fits the rate's window, if it does not fit now; null when it fits (or no start ever can). */
  nextStartAt: Date | null;
  /** The key's pause, if it is paused now. `until` null: until resumed. */
  pause: KeyPause | null;
  /**
   * When the claim looks at its waiting tasks again: `due` (the next claim),
   * `scheduled` (at `wakeAt`: a pause's end, a start leaving the window),
   * `on-release` (when one of its running tasks gives a slot back), `none`.
   */
  wake: 'due' | 'scheduled' | 'on-release' | 'none';
  wakeAt: Date | null;
  /** Tasks waiting for the key, counted up to {@link WAITING_CAP}. */
  waiting: number;
  /** True when more than `waiting` tasks wait (the count stopped at the cap). */
  waitingMore: boolean;
}

/** A key's pause: till when, why, and who paused it as far as the row tells. */
export interface KeyPause {
  until: Date | null;
  reason: string | null;
  /**
   * `rate-limited`: a task's RateLimitedError (a provider's 429) paused it;
   * `hand`: pauseKey (the API, the CLI, the dashboard); from the key's
   * `paused_by`.
   */
  by: 'rate-limited' | 'hand' | null;
}

/** Why tasks wait for a key, if they do: the first of its limits that holds them, in the order the claim checks. */
export interface KeyWait {
  kind: 'paused' | 'concurrency' | 'rate';
  /** In words: "5 of 5 running for key openai", "rate limit openai-tokens: next start at …", "key openai paused until … after a 429: …". */
  text: string;
}

/** A paused queue. */
export interface QueuePause {
  queue: string;
  reason: string | null;
  pausedAt: Date;
}

/** The reason pauseKey writes when given none. */
const HAND_REASON = 'paused by hand';

// One row per key asked for ($1: [{"key", "declared"}], in order), on the
// clock $2 (null: the database's). What a key's tasks declare comes from the
// caller (a task's own limits), else from its first waiting task, else from
// the task of its last start: what the claim will hold the next start to.
const KEY_STATES_SQL = `
WITH clock AS (
  SELECT coalesce($2::timestamptz, pg_catalog.now()) AS now_at,
         extract(epoch FROM coalesce($2::timestamptz, pg_catalog.now())) OPERATOR(pg_catalog.*) 1000 AS now_ms
), asked AS (
  SELECT u.e OPERATOR(pg_catalog.->>) 'key' AS key, u.e OPERATOR(pg_catalog.->) 'declared' AS given, u.nth
  FROM pg_catalog.jsonb_array_elements($1::jsonb) WITH ORDINALITY AS u(e, nth)
), base AS (
  SELECT a.key, a.nth, l.key IS NOT NULL AS known, coalesce(l.running, 0) AS running,
         l.concurrency, l.seen_concurrency, l.rate_limit, l.rate_period_ms, l.starts, l.paused_until, l.paused_reason, l.paused_by, l.wake_at,
         (SELECT pg_catalog.count(*)::int FROM (
            SELECT 1 FROM outlive.tasks t
            WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.blocked_on OPERATOR(pg_catalog.=) a.key
            LIMIT $3) w) AS waiting,
         coalesce(
           CASE WHEN pg_catalog.jsonb_typeof(a.given) OPERATOR(pg_catalog.=) 'object' THEN a.given END,
           (SELECT x.e FROM (SELECT t.limits FROM outlive.tasks t
                             WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.blocked_on OPERATOR(pg_catalog.=) a.key
                             ORDER BY t.priority DESC NULLS LAST, t.vt, t.id LIMIT 1) h,
                   pg_catalog.jsonb_array_elements(h.limits) AS x(e)
            WHERE (x.e OPERATOR(pg_catalog.->>) 'k') OPERATOR(pg_catalog.=) a.key LIMIT 1),
           (SELECT x.e FROM outlive.tasks t, pg_catalog.jsonb_array_elements(t.limits) AS x(e)
            WHERE t.id OPERATOR(pg_catalog.=) ((l.starts OPERATOR(pg_catalog.->) '-1'::int) OPERATOR(pg_catalog.->>) 2)::bigint
              AND (x.e OPERATOR(pg_catalog.->>) 'k') OPERATOR(pg_catalog.=) a.key LIMIT 1)) AS declared
  FROM asked a LEFT JOIN outlive.limits l ON l.key OPERATOR(pg_catalog.=) a.key
), rated AS (
  SELECT b.*,
         coalesce(b.rate_limit::float8, (b.declared OPERATOR(pg_catalog.->>) 'r')::float8) AS lim,
         coalesce(b.rate_period_ms::float8, (b.declared OPERATOR(pg_catalog.->>) 'p')::float8) AS per,
         coalesce((b.declared OPERATOR(pg_catalog.->>) 'c')::float8, 1) AS cost,
         (b.declared OPERATOR(pg_catalog.->>) 'b')::float8 AS burst
  FROM base b
)
SELECT r.key, r.known, r.running, r.concurrency, coalesce((r.declared OPERATOR(pg_catalog.->>) 'n')::int, r.seen_concurrency) AS declared_concurrency,
       r.rate_limit, r.lim, r.per, r.cost, r.waiting,
       (r.paused_until OPERATOR(pg_catalog.>) c.now_at) IS TRUE AS paused,
       CASE WHEN pg_catalog.isfinite(r.paused_until) THEN r.paused_until END AS paused_until, r.paused_reason, r.paused_by,
       CASE WHEN r.wake_at IS NULL THEN 'none' WHEN r.wake_at OPERATOR(pg_catalog.<=) c.now_at THEN 'due'
            WHEN pg_catalog.isfinite(r.wake_at) THEN 'scheduled' ELSE 'on-release' END AS wake,
       CASE WHEN pg_catalog.isfinite(r.wake_at) THEN r.wake_at END AS wake_at,
       CASE WHEN r.lim IS NOT NULL THEN w.used END AS used,
       r.burst,
       CASE WHEN n.at OPERATOR(pg_catalog.>) c.now_ms AND n.at OPERATOR(pg_catalog.<) 'infinity'::float8 THEN n.at END AS next_ms
FROM rated r CROSS JOIN clock c
CROSS JOIN LATERAL (
  SELECT coalesce(pg_catalog.sum((s.e OPERATOR(pg_catalog.->>) 1)::float8), 0) AS used
  FROM pg_catalog.jsonb_array_elements(coalesce(r.starts, '[]'::jsonb)) AS s(e)
  WHERE (s.e OPERATOR(pg_catalog.->>) 0)::float8 OPERATOR(pg_catalog.>) (c.now_ms OPERATOR(pg_catalog.-) r.per)
) w
LEFT JOIN LATERAL (
  SELECT outlive.rate_next_start(coalesce(r.starts, '[]'::jsonb), r.lim, r.per, r.cost, r.burst, c.now_ms) AS at
) n ON r.lim IS NOT NULL
ORDER BY r.nth`;

interface KeyStateRow {
  key: string; known: boolean; running: number; concurrency: number | null; declared_concurrency: number | null;
  rate_limit: number | null; lim: number | null; per: number | null; burst: number | null; cost: number; waiting: number;
  paused: boolean; paused_until: Date | null; paused_reason: string | null; paused_by: 'hand' | '429' | null; used: number | null; next_ms: number | null;
  wake: KeyState['wake']; wake_at: Date | null;
}

function toKeyState(r: KeyStateRow, cap: number): KeyState {
  const reason = r.paused_reason;
  const by = !r.paused ? null : r.paused_by === '429' ? 'rate-limited' : r.paused_by === 'hand' ? 'hand' : null;
  return {
    key: r.key,
    known: r.known,
    running: r.running,
    concurrency: r.concurrency ?? r.declared_concurrency,
    concurrencySet: r.concurrency !== null,
    rate: r.lim === null || r.per === null ? null : { limit: r.lim, periodMs: r.per, ...(r.burst !== null && r.burst < r.lim ? { burst: r.burst } : {}) },
    rateSet: r.rate_limit !== null,
    windowUsed: r.used,
    nextCost: r.cost,
    nextStartAt: r.next_ms === null ? null : new Date(Math.ceil(r.next_ms)),
    pause: r.paused ? { until: r.paused_until, reason, by } : null,
    wake: r.wake,
    wakeAt: r.wake_at,
    waiting: Math.min(r.waiting, cap - 1),
    waitingMore: r.waiting >= cap,
  };
}

/**
 * Where each of these keys stands (in the order given; a key without a row
 * reads as idle). `declared` is what one task declares of the key, to judge
 * its next start by; left out, the key's first waiting task's is taken.
 */
export async function readKeyStates(
  q: Executor,
  keys: readonly { key: string; declared?: RowLimit | null }[],
  options: { now?: Date; waitingCap?: number } = {},
): Promise<KeyState[]> {
  if (keys.length === 0) return [];
  // One more than the cap is counted, to tell "exactly the cap" from "more".
  const cap = (options.waitingCap ?? WAITING_CAP) + 1;
  const asked = JSON.stringify(keys.map((k) => ({ key: k.key, declared: k.declared ?? null })));
  const rows = await q.query<KeyStateRow>(KEY_STATES_SQL, [asked, options.now ?? null, cap]);
  return rows.map((r) => toKeyState(r, cap));
}

/** Where each of these keys stands; see {@link readKeyStates}. */
export function keyStates(db: Database, keys: readonly string[], options: { now?: Date } = {}): Promise<KeyState[]> {
  return readKeyStates(exec(db), keys.map((key) => ({ key })), options);
}

// The keys, those that matter now first (paused, with tasks waiting, with
// tasks running), then by name; and how many keys there are in all.
const LIST_KEYS_SQL = `
SELECT l.key, pg_catalog.count(*) OVER () AS total FROM outlive.limits l
WHERE $1::text[] IS NULL OR l.key OPERATOR(pg_catalog.=) ANY ($1::text[])
ORDER BY (l.paused_until OPERATOR(pg_catalog.>) coalesce($2::timestamptz, pg_catalog.now())) IS TRUE DESC,
         l.wake_at IS NOT NULL DESC, (l.running OPERATOR(pg_catalog.>) 0) DESC, l.key
LIMIT $3`;

/**
 * The keys of outlive.limits with where each stands, sorted by name: at most
 * `limit`, those paused, with tasks waiting or running taken first when
 * there are more. `total` counts them all.
 */
export async function listKeys(
  db: Database,
  options: { keys?: readonly string[]; limit?: number; now?: Date } = {},
): Promise<{ keys: KeyState[]; total: number }> {
  const q = exec(db);
  const rows = await q.query<{ key: string; total: string }>(LIST_KEYS_SQL, [options.keys ?? null, options.now ?? null, options.limit ?? 100]);
  const keys = await readKeyStates(q, rows.map((r) => ({ key: r.key })).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)), options);
  return { keys, total: rows.length === 0 ? 0 : Number(rows[0]!.total) };
}

// The distinct keys tasks wait for, one index probe each (a skip scan of
// tasks_blocked_idx) however many tasks wait, and the keys paused now
// (outlive.limits is one row per key), by name.
const WAITED_KEYS_SQL = `
WITH RECURSIVE k(key) AS (
  (SELECT t.blocked_on FROM outlive.tasks t
   WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.blocked_on IS NOT NULL
   ORDER BY t.blocked_on LIMIT 1)
  UNION ALL
  SELECT (SELECT t.blocked_on FROM outlive.tasks t
          WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.blocked_on OPERATOR(pg_catalog.>) k.key
          ORDER BY t.blocked_on LIMIT 1)
  FROM k WHERE k.key IS NOT NULL
)
SELECT x.key FROM (
  (SELECT k.key FROM k WHERE k.key IS NOT NULL LIMIT $1)
  UNION
  (SELECT l.key FROM outlive.limits l
   WHERE l.paused_until OPERATOR(pg_catalog.>) coalesce($2::timestamptz, pg_catalog.now())
   ORDER BY l.key LIMIT $1)
) x ORDER BY x.key LIMIT $1`;

/** The keys that hold tasks back: those tasks wait for, and those paused (at most `limit`, by name), with where each stands. */
export async function waitedKeys(db: Database, options: { limit?: number; now?: Date } = {}): Promise<KeyState[]> {
  return readWaitedKeys(exec(db), options);
}

async function readWaitedKeys(q: Executor, options: { limit?: number; now?: Date }): Promise<KeyState[]> {
  const rows = await q.query<{ key: string }>(WAITED_KEYS_SQL, [options.limit ?? 50, options.now ?? null]);
  return readKeyStates(q, rows.map((r) => ({ key: r.key })), options);
}

/** The paused queues, by name. */
export async function pausedQueues(db: Database): Promise<QueuePause[]> {
  return readPausedQueues(exec(db));
}

async function readPausedQueues(q: Executor): Promise<QueuePause[]> {
  const rows = await q.query<{ queue: string; reason: string | null; paused_at: Date }>(
    `SELECT p.queue, p.reason, p.paused_at FROM outlive.queue_pauses p ORDER BY p.queue LIMIT 1000`,
  );
  return rows.map((r) => ({ queue: r.queue, reason: r.reason, pausedAt: r.paused_at }));
}

/** "250ms", "30s", "1m", "1h", "1d", or "90s" when it is not a whole minute. */
export function formatPeriod(ms: number): string {
  for (const [unit, size] of [['d', 86_400_000], ['h', 3_600_000], ['m', 60_000], ['s', 1_000]] as const) {
    if (ms >= size && ms % size === 0) return `${ms / size}${unit}`;
  }
  return `${ms}ms`;
}

/** A number of cost units, without float noise. */
function amount(n: number): string {
  return String(Math.round(n * 1000) / 1000);
}

/** In words, how a key is paused: "key openai paused until … after a 429: …", "key x paused by hand until resumed". */
export function pauseText(key: string, pause: KeyPause): string {
  const until = pause.until ? `until ${pause.until.toISOString()}` : 'until resumed';
  const reason = pause.reason && pause.reason !== HAND_REASON ? `: ${pause.reason}` : '';
  if (pause.by === 'rate-limited') return `key ${key} paused ${until} after a 429${reason}`;
  if (pause.by === 'hand') return `key ${key} paused by hand ${until}${reason}`;
  return `key ${key} paused ${until}${reason}`;
}

/**
 * Why the key holds back its next start, in the order the claim checks (a
 * pause, then its concurrency, then its rate); null when it has room.
 */
export function keyWait(s: KeyState): KeyWait | null {
  if (s.pause) return { kind: 'paused', text: pauseText(s.key, s.pause) };
  if (s.concurrency !== null && s.running >= s.concurrency) {
    return { kind: 'concurrency', text: `${s.running} of ${s.concurrency} running for key ${s.key}` };
  }
  if (s.rate && s.windowUsed !== null && s.windowUsed + s.nextCost > s.rate.limit) {
    const per = `${amount(s.windowUsed)} of ${s.rate.limit} per ${formatPeriod(s.rate.periodMs)} used`;
    return {
      kind: 'rate',
      text: s.nextStartAt
        ? `rate limit ${s.key}: next start at ${s.nextStartAt.toISOString()} (${per})`
        : `rate limit ${s.key}: a start costing ${amount(s.nextCost)} cannot fit ${s.rate.limit} per ${formatPeriod(s.rate.periodMs)} (${per})`,
    };
  }
  return null;
}

/**
 * In words, when tasks that wait for a key with room are looked at again
 * (for a key {@link keyWait} finds nothing holding back).
 */
export function roomText(s: KeyState): string {
  switch (s.wake) {
    case 'due':
      return `key ${s.key} has room again: the next pass takes its waiting tasks`;
    case 'scheduled':
      return `key ${s.key} has room: its waiting tasks are looked at again at ${s.wakeAt!.toISOString()}`;
    case 'on-release':
      return `key ${s.key} has room (${s.running} running), but its waiting tasks are looked at again only when one of its running tasks gives its slot back`;
    default:
      return `key ${s.key} has room, but nothing wakes its waiting tasks`;
  }
}
