/**
 * Enqueue: a task becomes a row, written in the caller's transaction.
 *
 * Enqueue never opens a transaction of its own. Given the transaction that
 * writes the business change, the task row commits or rolls back with it; the
 * wake-up NOTIFY (fired by the insert trigger) is delivered only on commit.
 */
import { toExecutor, type Transactional } from '../db/executor.js';
import { fail, prepareOptions, prepareRow, type EnqueueManyOptions, type EnqueueOptions, type Prepared } from '../model/row.js';
import type { RowFlow } from '../model/limits.js';
import type { AnyTask, TaskInput } from '../model/task.js';
import type { TaskState } from '../model/states.js';
import { OutliveError } from '../model/errors.js';
import { withSendSpan } from '../model/telemetry.js';

/** The row an enqueue wrote, or found under the same key. */
export interface EnqueuedTask {
  id: string;
  name: string;
  queue: string;
  state: TaskState;
  runAt: Date;
  /** True when an unfinished task with the same key already existed and was returned instead. */
  deduplicated: boolean;
  /** With keyMode 'replace' or 'preserve_run_at': true when that pending task took this input. */
  replaced?: boolean;
}

/**
 * The statement and parameters that insert rows sharing one set of options:
 * INSERT_TASKS, or INSERT_GOVERNED_TASKS for a task with flow control
 * (`flows`, one per row). `trace` is the enqueue's trace context, null
 * without telemetry.
 */
export function insertStatement(
  p: Prepared,
  inputs: readonly string[],
  keys: readonly (string | null)[],
  flows: readonly (RowFlow | null)[] | null,
  trace: string | null,
): { text: string; values: unknown[] } {
  const values = [p.name, p.queue, p.priority, p.maxAttempts, p.timeoutMs, p.runAt, p.delayMs, inputs, keys, trace];
  if (!flows || flows.every((f) => f === null)) return { text: INSERT_TASKS, values };
  return { text: INSERT_GOVERNED_TASKS, values: [...values, flows.map((f) => f?.fairKey ?? ''), flows.map((f) => f?.limits ?? null)] };
}

// One statement for one task or a hundred thousand: the inputs travel as
// arrays and unnest into rows. ON CONFLICT names the partial unique index on
// (name, key) of unfinished tasks. DO NOTHING, not DO UPDATE: an update,
// even of key to itself, would need UPDATE on outlive.tasks, and a role that
// may only enqueue would then also be able to clear another writer's key
// (docs/shared-database.md). DO NOTHING still waits for a conflicting insert
// in progress: if that transaction commits, the row is skipped here and
// found by UNFINISHED_BY_KEY; if it rolls back, the row is inserted here.
// RETURNING gives the inserted rows only, in input order. (ROWS FROM is
// what unnest(a, b) stands for; only the unqualified name has that form.)
//
// The inputs travel as text[] and become jsonb row by row, not as jsonb[]:
// Postgres parses a jsonb[] parameter element by element into one memory
// context that lives as long as the array, and each element's parse
// allocates a 1 kB buffer there, so 100,000 inputs cost 100 MB of
// allocations before the first row is written. Measured on 100,000 inputs in
// one call (2 cores, PostgreSQL 15): Postgres CPU 18.0-19.0 ms per 1,000
// tasks as jsonb[], 8.1-8.3 as text[] (three pairs). The other statements
// that take JSON in arrays (runs, spawns, settles) do the same.
export const INSERT_TASKS = `
INSERT INTO outlive.tasks AS t (name, queue, priority, max_attempts, timeout_ms, run_at, input, key, trace_context)
SELECT $1, $2, $3, $4, $5, coalesce($6::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+) ($7::float8 OPERATOR(pg_catalog.*) interval '1 millisecond'),
       i.input::jsonb, i.key, $10::text
FROM ROWS FROM (pg_catalog.unnest($8::text[]), pg_catalog.unnest($9::text[])) AS i(input, key)
ON CONFLICT (name, key) WHERE key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[])
DO NOTHING
RETURNING id::text, queue, state::text, run_at, key`;

// Rows of a task with limits or fairness: INSERT_TASKS with the row's
// fairness key and limits, and its place in its fairness key's turn (vt)
// when it is ready now: after that key's last ready row, or at the head of
// the queue's ready rows if it has none (outlive.fair_start, migration
// 0014), 1/weight apart. A row for later is placed by the claim when due.
// Tasks without flow control never come here, so their enqueue is as before.
export const INSERT_GOVERNED_TASKS = `
WITH i AS (
  SELECT i.input, i.key, i.fair_key, i.limits, i.ord,
         coalesce($6::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+) ($7::float8 OPERATOR(pg_catalog.*) interval '1 millisecond') AS run_at
  FROM ROWS FROM (pg_catalog.unnest($8::text[]), pg_catalog.unnest($9::text[]), pg_catalog.unnest($11::text[]), pg_catalog.unnest($12::text[]))
       WITH ORDINALITY AS i(input, key, fair_key, limits, ord)
), turn AS (
  SELECT g.fair_key, b.base, b.step FROM (SELECT DISTINCT fair_key FROM i) g, LATERAL outlive.fair_start($2, g.fair_key) b
)
INSERT INTO outlive.tasks AS t (name, queue, priority, max_attempts, timeout_ms, run_at, input, key, fair_key, limits, vt, trace_context)
SELECT $1, $2, $3, $4, $5, i.run_at, i.input::jsonb, i.key, i.fair_key, i.limits::jsonb,
       CASE WHEN i.run_at OPERATOR(pg_catalog.<=) pg_catalog.now()
            THEN turn.base OPERATOR(pg_catalog.+) ((pg_catalog.row_number() OVER (PARTITION BY i.fair_key ORDER BY i.ord) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) turn.step) END,
       $10::text
FROM i JOIN turn ON turn.fair_key OPERATOR(pg_catalog.=) i.fair_key
ORDER BY i.ord
ON CONFLICT (name, key) WHERE key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[])
DO NOTHING
RETURNING id::text, queue, state::text, run_at, key`;

// Enqueues with a keyMode other than 'dedupe', through the function that
// may rewrite the pending row of a key (migration 0014).
const ENQUEUE_KEYED_SQL = `
SELECT * FROM outlive.enqueue_keyed($1, $2, $3, $4, $5,
  coalesce($6::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+) ($7::float8 OPERATOR(pg_catalog.*) interval '1 millisecond'),
  $8, $9, $10, $11, $12, $13)`;

// The unfinished rows of keys INSERT_TASKS skipped. A statement of its own:
// in READ COMMITTED a row that another transaction committed while the
// insert waited for it is not in the insert's snapshot, but is in this one's.
export const UNFINISHED_BY_KEY = `
SELECT id::text, queue, state::text, run_at, key FROM outlive.tasks
WHERE name OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) ANY ($2::text[]) AND key IS NOT NULL
  AND state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running']::outlive.task_state[])`;

/**
 * How many times an enqueue looks again for keys whose unfinished row it
 * neither wrote nor found: each round, such a row finished between the
 * insert that saw it and the read that looked for it.
 */
const ROUNDS = 10;

interface WrittenRow {
  id: string;
  queue: string;
  state: TaskState;
  run_at: Date;
  key: string | null;
}

function toTask(p: Prepared, r: WrittenRow, deduplicated: boolean): EnqueuedTask {
  return { id: r.id, name: p.name, queue: r.queue, state: r.state, runAt: new Date(r.run_at), deduplicated };
}

/**
 * Writes the rows (keys distinct) in the producer span of the enqueue,
 * returning one task per row in order. The common case, no key or no key
 * taken, is the one INSERT_TASKS statement.
 */
function insertRows(tx: Transactional, p: Prepared, inputs: string[], keys: (string | null)[], flows: (RowFlow | null)[]): Promise<EnqueuedTask[]> {
  return withSendSpan({ task: p.name, queue: p.queue, count: inputs.length }, (trace) => writeRows(tx, p, inputs, keys, flows, trace));
}

async function writeRows(tx: Transactional, p: Prepared, inputs: string[], keys: (string | null)[], flows: (RowFlow | null)[], trace: string | null): Promise<EnqueuedTask[]> {
  const db = toExecutor(tx);
  if (p.keyMode !== 'dedupe') {
    const rows = await db.query<WrittenRow & { replaced: boolean }>(ENQUEUE_KEYED_SQL, [
      p.name, p.queue, p.priority, p.maxAttempts, p.timeoutMs, p.runAt, p.delayMs, inputs, keys,
      flows.map((f) => f?.fairKey ?? null), flows.map((f) => f?.limits ?? null), p.keyMode === 'preserve_run_at', trace,
    ]);
    return rows.map((r) => ({ ...toTask(p, r, r.replaced), replaced: r.replaced }));
  }
  const insert = (at: readonly number[] | null) => {
    const { text, values } = at
      ? insertStatement(p, at.map((i) => inputs[i]!), at.map((i) => keys[i]!), at.map((i) => flows[i]!), trace)
      : insertStatement(p, inputs, keys, flows, trace);
    return db.query<WrittenRow>(text, values);
  };
  const written = await insert(null);
  const out: (EnqueuedTask | undefined)[] = new Array(inputs.length);
  // RETURNING keeps the input's order: unkeyed rows are matched by it, keyed rows by their key.
  const slotOfKey = new Map<string, number>();
  const unkeyed: number[] = [];
  keys.forEach((k, i) => (k === null ? unkeyed.push(i) : slotOfKey.set(k, i)));
  let next = 0;
  for (const r of written) out[r.key === null ? unkeyed[next++]! : slotOfKey.get(r.key)!] = toTask(p, r, false);
  let missing = keys.flatMap((k, i) => (out[i] === undefined ? [i] : []));
  for (let round = 0; missing.length > 0; round++) {
    if (round === ROUNDS) {
      throw new OutliveError(
        `outlive: enqueue of "${p.name}": ${missing.length} key(s) kept being taken by unfinished tasks that finished before they could be read, ${ROUNDS} times; enqueue again`,
      );
    }
    const found = await db.query<WrittenRow>(UNFINISHED_BY_KEY, [p.name, missing.map((i) => keys[i])]);
    for (const r of found) out[slotOfKey.get(r.key!)!] = toTask(p, r, true);
    missing = missing.filter((i) => out[i] === undefined);
    if (missing.length === 0) break;
    // Those rows finished in between, freeing their keys: write them again.
    const again = await insert(missing);
    for (const r of again) out[slotOfKey.get(r.key!)!] = toTask(p, r, false);
    missing = missing.filter((i) => out[i] === undefined);
  }
  return out as EnqueuedTask[];
}

/**
 * Enqueues one task inside the caller's transaction.
 *
 * ```ts
 * await db.transaction(async (tx) => {
 *   const [user] = await tx.insert(users).values({ email }).returning();
 *   await enqueue(tx, sendWelcome, { userId: user.id });
 * });
 * ```
 *
 * `tx` is a drizzle transaction (node-postgres or Neon drivers) or a pg/Neon
 * client inside BEGIN. The input is checked against the task's schema first:
 * an invalid input throws {@link InvalidEnqueueError} with the schema's issues and
 * writes nothing.
 */
export async function enqueue<T extends AnyTask>(
  tx: Transactional,
  task: T,
  input: TaskInput<T>,
  options: EnqueueOptions = {},
): Promise<EnqueuedTask> {
  const row = prepareRow(task, input, options.key === undefined ? null : { key: options.key }, options);
  const [written] = await insertRows(tx, row.options, [row.input], [row.key], [row.flow]);
  return written!;
}

/**
 * Enqueues many tasks of one kind in a single statement, inside the caller's
 * transaction. Every input is validated before anything is written. Returns
 * one entry per input, in order; inputs that share a key share a row.
 */
export async function enqueueMany<T extends AnyTask>(
  tx: Transactional,
  task: T,
  inputs: readonly TaskInput<T>[],
  options: EnqueueManyOptions<TaskInput<T>> = {},
): Promise<EnqueuedTask[]> {
  const prepared = prepareOptions(task, options as EnqueueManyOptions<unknown>);
  if (!Array.isArray(inputs)) fail(task, 'enqueueMany takes an array of inputs');
  const json: string[] = [];
  const keys: (string | null)[] = [];
  const flows: (RowFlow | null)[] = [];
  // Inputs sharing a key are folded into one row here and mapped back
  // afterwards: each key is written or found once.
  const slotOf: number[] = [];
  const repeated = new Set<number>();
  const slotByKey = new Map<string, number>();
  for (const input of inputs) {
    const { input: serialised, key, flow } = prepareRow(task, input, options.key ? { key: options.key(input) } : null, {}, prepared);
    const seen = key === null ? undefined : slotByKey.get(key);
    if (seen !== undefined) {
      repeated.add(slotOf.length);
      slotOf.push(seen);
      continue;
    }
    if (key !== null) slotByKey.set(key, json.length);
    slotOf.push(json.length);
    json.push(serialised);
    keys.push(key);
    flows.push(flow);
  }
  if (json.length === 0) return [];
  const rows = await insertRows(tx, prepared, json, keys, flows);
  return slotOf.map((slot, i) => {
    const row = rows[slot]!;
    return repeated.has(i) ? { ...row, deduplicated: true } : row;
  });
}
