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
 * The statement is the one `enqueue` runs, and its row is checked by the
 * same function (`prepareRow`: input, options and key, before anything is
 * sent), so the two cannot drift apart.
 * A batch has no way to pass one query's result to the next: the input must
 * be known before the batch is sent (generate ids in the app, as above).
 */
import { INSERT_TASKS, insertParams, type EnqueuedTask } from './enqueue.js';
import { prepareRow, type EnqueueOptions } from '../model/row.js';
import { toStatementSql, type StatementSql } from '../db/executor.js';
import type { AnyTask, TaskInput } from '../model/task.js';
import type { TaskState } from '../model/states.js';

/**
 * Builds the statement that enqueues one task, as drizzle's `execute` takes
 * a statement (see `StatementSql`).
 * Validates the input against the task's schema and the options first, and
 * throws {@link InvalidEnqueueError} before anything is sent. Run it with
 * any drizzle database's `execute`, or use {@link batchEnqueue}.
 */
export function enqueueSql<T extends AnyTask>(task: T, input: TaskInput<T>, options: EnqueueOptions = {}): StatementSql {
  const row = prepareRow(task, input, options.key === undefined ? null : { key: options.key }, options);
  return toStatementSql(INSERT_TASKS, insertParams(row.options, [row.input], [row.key]));
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
  id: string;
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
 */
export function enqueuedFrom(task: AnyTask, result: unknown): EnqueuedTask {
  const rows = (Array.isArray(result) ? result : (result as { rows?: unknown })?.rows) as ReturnedRow[] | undefined;
  const row = Array.isArray(rows) ? rows[0] : undefined;
  if (!row || typeof row !== 'object' || !('id' in row)) {
    throw new TypeError('outlive: enqueuedFrom expects the result of a batchEnqueue item');
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
