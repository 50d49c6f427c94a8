/**
 * Lists of tasks a page at a time, newest first, filtered and searched,
 * that cost the same at a million rows as at a thousand: a page walks the
 * primary key backwards from its cursor (never OFFSET) and reads at most a
 * window of rows; filters that match fewer rows than a page in that window
 * show what they found and continue from where the window ended.
 */
import { toExecutor, toPool, type Database } from '../db/executor.js';
import type { TaskState } from '../model/states.js';
import { TASK_COLUMNS, toSummary, type TaskSummary } from './queries.js';

/** What a task list is filtered by; every field optional. */
export interface TaskQuery {
  state?: TaskState;
  name?: string;
  queue?: string;
  /** The idempotency key. */
  key?: string;
  /** Created at or after. */
  from?: Date;
  /** Created before. */
  to?: Date;
  /** Text the last error contains (case-insensitive). */
  error?: string;
}

/** One page of a task list. */
export interface TaskPage {
  tasks: TaskSummary[];
  /** The id to continue before (`before`), null when the table ends here. */
  next: string | null;
  /** Whether the page stopped at the window rather than filling up: its tasks are all the matches among the rows it read. */
  windowEnded: boolean;
}

/** Rows a page of a filtered list reads at most: about 20 ms of Postgres time (docs/benchmarks.md). */
export const LIST_WINDOW = 50_000;

// The filters, on a row `t`, in parameters $n to $n+6: one statement for
// every combination, so it is prepared once, and each absent filter drops
// out as `$k IS NULL`.
function filters(n: number): string {
  const $ = (k: number) => `$${n + k}`;
  return `(${$(0)}::text IS NULL OR t.state::text OPERATOR(pg_catalog.=) ${$(0)}) AND (${$(1)}::text IS NULL OR t.name OPERATOR(pg_catalog.=) ${$(1)})
  AND (${$(2)}::text IS NULL OR t.queue OPERATOR(pg_catalog.=) ${$(2)}) AND (${$(3)}::text IS NULL OR t.key OPERATOR(pg_catalog.=) ${$(3)})
  AND (${$(4)}::timestamptz IS NULL OR t.created_at OPERATOR(pg_catalog.>=) ${$(4)}) AND (${$(5)}::timestamptz IS NULL OR t.created_at OPERATOR(pg_catalog.<) ${$(5)})
  AND (${$(6)}::text IS NULL OR pg_catalog.strpos(pg_catalog.lower(t.last_error), pg_catalog.lower(${$(6)})) OPERATOR(pg_catalog.>) 0)`;
}

// The window: the $2 rows before the cursor $1 (from the newest when null), by the primary key.
const WINDOW = `SELECT w.id FROM outlive.tasks w WHERE $1::bigint IS NULL OR w.id OPERATOR(pg_catalog.<) $1 ORDER BY w.id DESC LIMIT $2`;

const PAGE_SQL = `SELECT ${TASK_COLUMNS} FROM (SELECT * FROM outlive.tasks w WHERE $1::bigint IS NULL OR w.id OPERATOR(pg_catalog.<) $1 ORDER BY w.id DESC LIMIT $2) t
WHERE ${filters(3)} ORDER BY t.id DESC LIMIT $10`;

const WINDOW_END_SQL = `SELECT pg_catalog.min(w.id)::text AS last, pg_catalog.count(*)::int AS n FROM (${WINDOW}) w`;

// Every match in the given states (finished ones by tasks_state_finished_idx;
// pending and running, which few rows are, along the primary key), not a window's.
const IDS_SQL = (finished: boolean, plain: boolean) => `SELECT t.id::text AS id FROM outlive.tasks t
WHERE t.state OPERATOR(pg_catalog.=) ANY ($1::outlive.task_state[]) ${finished ? 'AND t.finished_at IS NOT NULL' : 'AND t.finished_at IS NULL'} ${plain ? 'AND t.run_id IS NULL' : ''}
  AND ($2::bigint IS NULL OR t.id OPERATOR(pg_catalog.<) $2) AND ${filters(4)}
ORDER BY t.id DESC LIMIT $3`;

function params(q: TaskQuery): unknown[] {
  return [q.state ?? null, q.name || null, q.queue || null, q.key || null, q.from ?? null, q.to ?? null, q.error || null];
}

/** A page of tasks matching `query`, newest first, before the id `before` (from the newest when absent). */
export async function browseTasks(db: Database, query: TaskQuery, options: { before?: string | null; limit?: number; window?: number } = {}): Promise<TaskPage> {
  const exec = toExecutor(toPool(db));
  const limit = options.limit ?? 50;
  const window = options.window ?? LIST_WINDOW;
  const before = options.before || null;
  const rows = await exec.query(PAGE_SQL, [before, window, ...params(query), limit + 1]);
  if (rows.length > limit) {
    rows.length = limit;
    const tasks = rows.map(toSummary);
    return { tasks, next: tasks.at(-1)!.id, windowEnded: false };
  }
  const [end] = await exec.query<{ last: string | null; n: number }>(WINDOW_END_SQL, [before, window]);
  return { tasks: rows.map(toSummary), next: end!.n < window ? null : end!.last, windowEnded: end!.n >= window };
}

/**
 * The ids of the tasks matching `query` that are in one of `states`, at most
 * `limit`, before the id `before`, newest first: the rows a bulk action
 * works through a batch at a time, each batch by its own guarded statement.
 * Unlike a list page it reads on until it has `limit` ids (or the table
 * ends), so a bulk action's count is of every match; `outsideRuns` keeps
 * tasks of runs out.
 */
export async function matchingIds(
  db: Database,
  query: TaskQuery,
  states: readonly TaskState[],
  options: { before?: string | null; limit: number; outsideRuns?: boolean },
): Promise<string[]> {
  const finished = states.every((s) => s !== 'pending' && s !== 'running');
  const rows = await toExecutor(toPool(db)).query<{ id: string }>(IDS_SQL(finished, options.outsideRuns ?? false), [states, options.before || null, options.limit, ...params(query)]);
  return rows.map((r) => r.id);
}
