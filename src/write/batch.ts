/**
 * Enqueue over HTTP: a task row as one item of a drizzle `db.batch([...])`.
 *
 * drizzle's neon-http driver sends each query as one HTTP request and has no
 * interactive transaction, so `enqueue(tx, ...)` has no `tx` to take. What it
 * has is `db.batch([...])`: its queries travel in one request and the server
 * runs them in one transaction. Put the business write and the enqueue in the
 * same batch, and the task row commits or rolls back with the business change,
 * exactly as `enqueue` inside `db.transaction` does.
 *
 * ```ts
 * const db = drizzle(neon(env.DATABASE_URL));
 * const [, queued] = await db.batch([
 *   db.insert(orders).values({ id: orderId, total }),
 *   batchEnqueue(db, chargeCard, { orderId }),
 * ]);
 * const task = enqueuedFrom(chargeCard, queued);
 * ```
 *
 * The statement is the insert `enqueue` runs, with the unfinished row of a
 * key already taken read in the same statement, and its row is checked by
 * the same function (`prepareRow`: input, options and key, before anything
 * is sent), so the two cannot drift apart.
 * A batch has no way to pass one query's result to the next: the input must
 * be known before the batch is sent (generate ids in the app, as above).
 */
import { INSERT_GOVERNED_TASKS, INSERT_TASKS, insertStatement, type EnqueuedTask } from './enqueue.js';
import { OutliveError } from '../model/errors.js';
import { fail, prepareRow, type EnqueueOptions } from '../model/row.js';
import { telemetry } from '../model/telemetry.js';
import { toStatementSql, type StatementSql } from '../db/executor.js';
import type { AnyTask, TaskInput } from '../model/task.js';
import type { TaskState } from '../model/states.js';

// A batch has no second statement to find the row of a key already taken,
// so this one does both: the insert, and where it wrote nothing, the
// unfinished row of the key, read with the statement's snapshot. That finds
// the row whenever its transaction committed before the batch's statement
// began, which is every case but a race: if the key's row was being written
// by a transaction still open when this statement began, the insert waits
// for that one to commit and then skips, and this snapshot cannot see that
// row. The last branch says so with a row of nulls, and enqueuedFrom
// explains it (see there).
const batchEnqueueSql = (insert: string) => `
WITH written AS (${insert}
), found AS (
  SELECT t.id::text, t.queue, t.state::text, t.run_at FROM outlive.tasks t
  WHERE NOT EXISTS (SELECT FROM written) AND t.name OPERATOR(pg_catalog.=) $1
    AND t.key OPERATOR(pg_catalog.=) ANY ($9::text[]) AND t.key IS NOT NULL
    AND t.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[])
)
SELECT id, queue, state, run_at, true AS inserted FROM written
UNION ALL SELECT id, queue, state, run_at, false FROM found
UNION ALL SELECT NULL, NULL, NULL, NULL, false WHERE NOT EXISTS (SELECT FROM written) AND NOT EXISTS (SELECT FROM found)`;
const BATCH_ENQUEUE_SQL = new Map([INSERT_TASKS, INSERT_GOVERNED_TASKS].map((insert) => [insert, batchEnqueueSql(insert)]));

/**
 * Builds the statement that enqueues one task, as drizzle's `execute` takes
 * a statement (see `StatementSql`).
 * Validates the input against the task's schema and the options first, and
 * throws {@link InvalidEnqueueError} before anything is sent. Run it with
 * any drizzle database's `execute`, or use {@link batchEnqueue}.
 */
export function enqueueSql<T extends AnyTask>(task: T, input: TaskInput<T>, options: EnqueueOptions = {}): StatementSql {
  const row = prepareRow(task, input, options.key === undefined ? null : { key: options.key }, options);
  if (row.options.keyMode !== 'dedupe') fail(task, `keyMode '${row.options.keyMode}' works with enqueue and enqueueMany, not in a batch`);
  // The batch is sent later, by the app: the span marks the row's creation.
  const span = telemetry()?.startSend({ task: row.options.name, queue: row.options.queue, count: 1 }) ?? null;
  const { text, values } = insertStatement(row.options, [row.input], [row.key], [row.flow], span?.context ?? null);
  span?.end();
  return toStatementSql(BATCH_ENQUEUE_SQL.get(text)!, values);
}

/** A drizzle database whose `execute` makes a query that `db.batch` accepts (neon-http, and others). */
export interface BatchingDatabase {
  // drizzle types the parameter as its own SQLWrapper (see StatementSql).
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  execute(query: any): unknown;
}

/**
 * Makes the batch item that enqueues one task: `db.execute(enqueueSql(...))`.
 * Nothing runs until the batch is sent. Read its result with
 * {@link enqueuedFrom}.
 */
export function batchEnqueue<D extends BatchingDatabase, T extends AnyTask>(
  db: D,
  task: T,
  input: TaskInput<T>,
  options: EnqueueOptions = {},
): ReturnType<D['execute']> {
  return db.execute(enqueueSql(task, input, options)) as ReturnType<D['execute']>;
}

interface ReturnedRow {
  id: string | null;
  queue: string;
  state: TaskState;
  run_at: string | Date;
  inserted: boolean | string;
}

// neon-http (through drizzle) hands timestamps back as Postgres text,
// `2026-01-02 03:04:05.678+00`, which not every runtime's Date parses.
function toDate(value: string | Date): Date {
  if (value instanceof Date) return value;
  const m = /^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2}(?:\.\d+)?)(Z|[+-]\d{2}(?::?\d{2})?)?$/.exec(value);
  if (!m) return new Date(value);
  let zone = m[3] ?? 'Z';
  if (/^[+-]\d{2}$/.test(zone)) zone += ':00';
  else if (/^[+-]\d{4}$/.test(zone)) zone = `${zone.slice(0, 3)}:${zone.slice(3)}`;
  return new Date(`${m[1]}T${m[2]}${zone}`);
}

/**
 * Reads what a {@link batchEnqueue} item returned (its entry in the array
 * `db.batch` resolves with, or an `execute` result) as the task it wrote, or
 * the unfinished task with the same key that it found instead.
 *
 * Throws an {@link OutliveError} in one race: the key's task was being
 * enqueued by another transaction, which committed while this batch waited
 * for it, so the batch wrote nothing and its one statement could not read
 * that task. The batch has committed, and the key has its one task; to get
 * it, `enqueue(db, task, input, { key })` returns it (deduplicated). An error
 * rather than a result without an id: every caller would have to handle a
 * missing id for a case that almost never comes, and most would not notice
 * it had.
 */
export function enqueuedFrom(task: AnyTask, result: unknown): EnqueuedTask {
  const rows = (Array.isArray(result) ? result : (result as { rows?: unknown })?.rows) as ReturnedRow[] | undefined;
  const row = Array.isArray(rows) ? rows[0] : undefined;
  if (!row || typeof row !== 'object' || !('id' in row)) {
    throw new TypeError('outlive: enqueuedFrom expects the result of a batchEnqueue item');
  }
  if (row.id === null) {
    throw new OutliveError(
      `outlive: enqueuedFrom: this batch enqueued no "${task.name}" task: an enqueue of the same key by another transaction committed ` +
        'while the batch waited for it, and the batch could not read that task. The batch has committed and the key has its one task; ' +
        'enqueue(db, task, input, { key }) returns it (deduplicated)',
    );
  }
  return {
    id: String(row.id),
    name: task.name,
    queue: row.queue,
    state: row.state,
    runAt: toDate(row.run_at),
    deduplicated: !(row.inserted === true || row.inserted === 't' || row.inserted === 'true'),
  };
}
