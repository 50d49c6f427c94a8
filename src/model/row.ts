/**
 * A task row before it is written: its options checked against the task's
 * defaults, its input checked against the task's schema and serialised, its
 * key checked. Every way of writing a task (enqueue, enqueueMany,
 * batchEnqueue, a run's steps, spawns, schedules) passes through here, so
 * their checks cannot drift apart.
 */
import { InvalidEnqueueError } from './errors.js';
import { jsonBytesAtLeast, storableJson, storableText } from './json.js';
import { checkMaxAttempts, MAX_TIMEOUT_MS, type AnyTask } from './task.js';
import { checkName, formatIssues, isWhole } from './checks.js';
import { resolveFlow, type RowFlow } from './limits.js';
import { waitTask } from './wait.js';
import { ASYNC_SCHEMA, ASYNC_SCHEMA_FIX, isInputSchema, validateNow } from './input-schema.js';

/** Longest `delayMs` an enqueue takes: 100 years. Beyond some, the database's time arithmetic overflows. */
export const MAX_DELAY_MS = 3_155_760_000_000;

/** Earliest `runAt` an enqueue takes (the year 1): JavaScript's dates reach further back than PostgreSQL's. */
const EARLIEST_RUN_AT = Date.parse('0001-01-01T00:00:00Z');

/** Largest serialised input a task row accepts: 1 MiB. */
export const MAX_INPUT_BYTES = 1_048_576;

/** Options of one enqueue; each overrides the task's default. */
export interface EnqueueOptions {
  /** Earliest time the task may run. */
  runAt?: Date;
  /** Or: milliseconds from now (the database's clock) before it may run. */
  delayMs?: number;
  /** Higher runs first. */
  priority?: number;
  queue?: string;
  maxAttempts?: number;
  timeoutMs?: number;
  /**
   * Idempotency key, unique per task name among unfinished tasks: while a task
   * with this name and key is pending or running, enqueueing again returns it
   * (with `deduplicated: true`) instead of writing a second row. Once it has
   * finished, the key is free again.
   */
  key?: string;
  /**
   * What an enqueue does when a task with the key is unfinished (graphile-worker's
   * job_key_mode). 'dedupe' (default): returns it, unchanged. 'replace'
   * (debounce): a pending task takes the new input and run time, so a burst of
   * enqueues runs once, after the last; 'preserve_run_at' (throttle): it takes the
   * new input and keeps its run time. A running task keeps running and gives
   * its key up to a new pending row with the new input. Needs `key`.
   */
  keyMode?: KeyMode;
}

/** See {@link EnqueueOptions.keyMode}. */
export type KeyMode = 'dedupe' | 'replace' | 'preserve_run_at';
const KEY_MODES: readonly KeyMode[] = ['dedupe', 'replace', 'preserve_run_at'];

/** Options of a bulk enqueue: as {@link EnqueueOptions}, with a key computed per input. */
export interface EnqueueManyOptions<I> extends Omit<EnqueueOptions, 'key'> {
  key?: (input: I) => string;
}

/** Options checked, with the task's defaults filled in. */
export interface Prepared {
  name: string;
  queue: string;
  priority: number;
  maxAttempts: number;
  timeoutMs: number;
  runAt: Date | null;
  delayMs: number;
  keyMode: KeyMode;
}

export function fail(task: AnyTask, message: string): never {
  throw new InvalidEnqueueError(`outlive: cannot enqueue "${task?.name ?? String(task)}": ${message}`);
}

/** Checks options and fills defaults from the task. Throws before anything is written. */
export function prepareOptions(task: AnyTask, options: EnqueueOptions | EnqueueManyOptions<unknown> = {}): Prepared {
  if (!task || typeof task.name !== 'string' || !isInputSchema(task.input)) {
    throw new InvalidEnqueueError('outlive: enqueue needs a task made by defineTask()');
  }
  // The name is checked as defineTask checks it (the built-in wait task's is reserved): a task object built by hand, or by another version, may carry any string.
  try {
    if (task !== waitTask) checkName('task', task.name);
  } catch (err) {
    throw new InvalidEnqueueError((err as Error).message.replace(/^outlive: /, 'outlive: cannot enqueue: '));
  }
  const { runAt, delayMs = 0 } = options;
  if (runAt !== undefined && (!(runAt instanceof Date) || Number.isNaN(runAt.getTime()) || runAt.getTime() < EARLIEST_RUN_AT)) {
    fail(task, 'runAt must be a valid Date, from the year 1 on');
  }
  if (runAt !== undefined && options.delayMs !== undefined) fail(task, 'give runAt or delayMs, not both');
  if (typeof delayMs !== 'number' || !Number.isFinite(delayMs) || delayMs < 0 || delayMs > MAX_DELAY_MS) {
    fail(task, `delayMs must be a number of milliseconds from 0 to ${MAX_DELAY_MS} (100 years), got ${String(delayMs)}`);
  }
  const priority = options.priority ?? task.priority;
  if (!isWhole(priority, { min: -(2 ** 31 - 1), max: 2 ** 31 - 1 })) fail(task, 'priority must be a 32-bit whole number');
  const timeoutMs = options.timeoutMs ?? task.timeoutMs;
  if (!isWhole(timeoutMs, { min: 1, max: MAX_TIMEOUT_MS })) {
    fail(task, `timeoutMs must be a whole number from 1 to ${MAX_TIMEOUT_MS}`);
  }
  let queue: string;
  let maxAttempts: number;
  try {
    queue = checkName('queue', options.queue ?? task.queue);
    maxAttempts = checkMaxAttempts(options.maxAttempts ?? task.maxAttempts, `cannot enqueue "${task.name}"`);
  } catch (err) {
    throw new InvalidEnqueueError((err as Error).message);
  }
  const keyMode = options.keyMode ?? 'dedupe';
  if (!KEY_MODES.includes(keyMode)) fail(task, `keyMode must be one of ${KEY_MODES.map((m) => `'${m}'`).join(', ')}, got ${JSON.stringify(keyMode)}`);
  if (keyMode !== 'dedupe' && options.key === undefined) fail(task, `keyMode '${keyMode}' needs a key`);
  return { name: task.name, queue, priority, maxAttempts, timeoutMs, runAt: runAt ?? null, delayMs, keyMode };
}

/**
 * Validates one input against the task's schema and serialises it: the JSON
 * of the input as given, not the schema's output, which the pass makes again
 * from it. Throws before anything is written, for an asynchronous schema too.
 */
export function serialiseInput(task: AnyTask, input: unknown): string {
  // Plainly too big is refused first: before the schema walks it and JSON.stringify copies it.
  const least = jsonBytesAtLeast(input, MAX_INPUT_BYTES);
  if (least > MAX_INPUT_BYTES) fail(task, `input is at least ${least} bytes of JSON, over the limit of ${MAX_INPUT_BYTES}`);
  const result = validateNow(task.input, input);
  if (result === ASYNC_SCHEMA) fail(task, ASYNC_SCHEMA_FIX);
  if (result.issues) fail(task, `input does not match its schema: ${formatIssues(result.issues)}`);
  const stored = storableJson(input, MAX_INPUT_BYTES, true);
  if (stored.why !== undefined) fail(task, `input ${stored.why}`);
  if (stored.json === undefined) fail(task, 'input does not serialise to JSON (undefined)');
  return stored.json;
}

function checkKey(task: AnyTask, key: unknown): string {
  if (typeof key !== 'string' || key.length === 0 || key.length > 500) {
    fail(task, 'key must be a non-empty string of at most 500 characters');
  }
  if (storableText(key) !== key) fail(task, 'key must not contain NUL characters or unpaired surrogates');
  return key;
}

/** One task's row as every way of enqueueing writes it: the options, the serialised input and the key. */
export interface PreparedRow {
  options: Prepared;
  input: string;
  key: string | null;
  /** Its fairness key and limits; null for a task without flow control. */
  flow: RowFlow | null;
}

/** A row's flow control for one input: null for a task without limits or fairness. */
export function rowFlow(task: AnyTask, input: unknown): RowFlow | null {
  return task.flow ? resolveFlow(task.name, task.flow, input) : null;
}

/**
 * Checks and serialises one task row: the one door through which `enqueue`,
 * `enqueueMany` and `batchEnqueue` pass, so their checks cannot drift apart.
 * Throws {@link InvalidEnqueueError} before anything is written. `key` is
 * null for a row without one; `prepared` is the options already checked,
 * when many rows share them.
 */
export function prepareRow(task: AnyTask, input: unknown, key: { key: unknown } | null, options: EnqueueOptions | EnqueueManyOptions<unknown> = {}, prepared?: Prepared): PreparedRow {
  const o = prepared ?? prepareOptions(task, options);
  return { options: o, input: serialiseInput(task, input), key: key === null ? null : checkKey(task, key.key), flow: rowFlow(task, input) };
}
