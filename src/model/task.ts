/**
 * Defining a task: a name, a schema for its input (any Standard Schema: zod,
 * valibot, ArkType), a handler, and how it retries. Types flow from the
 * schema to the handler and to `enqueue`.
 */
import type { StandardSchemaV1 } from '@standard-schema/spec';
import { ConfigError } from './errors.js';
import { checkName, checkWhole, isWhole } from './checks.js';
import { notASchema, SCHEMA_FIX, type InputSchema } from './input-schema.js';
import type { BackoffOptions } from './backoff.js';
import type { Step } from './step.js';
import { checkFlow, type Fairness, type Flow, type Limit } from './limits.js';

/** What a handler sees of the task it runs. */
export interface TaskContext {
  /** The task row's id. */
  readonly taskId: string;
  /** This attempt's number, from 1. */
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly queue: string;
  /** The run this task belongs to, or null for a standalone task. */
  readonly runId: string | null;
  /**
   * Fires when the task's timeout is reached or its run is cancelled. Pass it
   * to fetch and friends; a handler that ignores it is abandoned at its
   * timeout, and its late result is discarded.
   */
  readonly signal: AbortSignal;
  /**
   * Adds a step to this task's run (runs only). What a task spawns is written
   * in the same transaction that records its success: if the attempt fails,
   * its spawns never existed. A spawned step may wait for other steps spawned
   * by this attempt and for steps already in the run.
   *
   * ```ts
   * for (const url of pages) ctx.spawn(`page:${url}`, step(importPage, { url }));
   * ctx.spawn('finish', step(finishImport, { siteId }, { after: pages.map((u) => `page:${u}`) }));
   * ```
   */
  spawn(step: string, spec: Step): void;
  /**
   * Extends this attempt's lease now, and tells whether it still holds it
   * (false: the task was cancelled or recovered; its signal has fired). The
   * pass already does this every second for tasks that run longer; call it
   * before a step whose result must not be written twice.
   */
  heartbeat(): Promise<boolean>;
  /** The stored output of a succeeded step of this task's run (runs only). */
  output<O = unknown>(step: string): Promise<O>;
  /** The outputs of the steps this task waited for, by step name (runs only). */
  outputs(): Promise<Record<string, unknown>>;
  /**
   * What this start really cost against its rate limits (the tokens a model
   * call used), replacing the estimate the claim reserved when the attempt
   * settles. With a key, that key's limit only; without, every limit of the
   * task that has a rate.
   */
  reportCost(actual: number, key?: string): void;
  /** "Not yet": throws a {@link SnoozeError} (do not catch it); at most MAX_SNOOZES times. */
  snooze(after: number | Date): never;
  /**
   * How far this attempt has got, for `explainRun`, the CLI and the dashboard;
   * written at most once a second, and never fails the attempt.
   */
  progress(progress: Progress): Promise<void>;
}

/** What `ctx.progress` takes: counts and a short note, all optional. */
export interface Progress {
  done?: number;
  total?: number;
  note?: string;
}

/** A task handler: takes the parsed input, returns the output to store. */
export type TaskHandler<I, O> = (input: I, ctx: TaskContext) => Promise<O> | O;

/**
 * How a task retries when its handler throws. An attempt its pass cut short
 * is not counted (up to {@link MAX_INTERRUPTIONS}), except with `maxAttempts: 1`.
 */
export interface RetryPolicy {
  /** Attempts in all, including the first, that the handler may fail. Default 5. */
  maxAttempts?: number;
  /** Delay before attempt n+1: exponential options, or a function of the failed attempt's number. */
  backoff?: BackoffOptions | ((attempt: number) => number);
}

/** Everything `defineTask` takes. */
export interface TaskConfig<S extends InputSchema, O> {
  /** Unique among the tasks a pass runs; stored in every row. */
  name: string;
  /**
   * The input's schema: any Standard Schema v1 (a zod 4, valibot or ArkType
   * schema). It validates the input at enqueue (nothing is written if it
   * fails; the row stores the JSON of the input as given) and again before
   * the handler runs, which receives the schema's parsed output (its
   * transforms and defaults applied). `enqueue` takes the schema's input
   * type. Enqueue validates synchronously: a schema with asynchronous parts
   * is refused there, so keep asynchronous checks in the handler.
   */
  input: S;
  /** The handler: receives the schema's output type, returns what to store. */
  run: TaskHandler<StandardSchemaV1.InferOutput<S>, O>;
  retry?: RetryPolicy;
  /** How long one attempt may run before its signal aborts it. Default 15 s. */
  timeoutMs?: number;
  /** Default queue for this task's rows. Default `"default"`. */
  queue?: string;
  /** Default priority; higher runs first. Default 0. */
  priority?: number;
  /**
   * Keep the row of a succeeded attempt as history (its output, its times,
   * the dashboard's counts). Default true. With false, a standalone task's
   * row is deleted by the statement that settles its success, as
   * graphile-worker does with every job: about a quarter of the settle's
   * database work (docs/benchmarks.md), for high-volume tasks whose outputs
   * nobody reads. Failures, retries and steps of runs are always kept (a
   * run's outputs feed the steps that wait on them).
   */
  keepSucceeded?: boolean;
  /**
   * Limits on keys this task's starts count against: concurrency, a rate in
   * any window, a cost per start. Enforced in the claim, across every pass
   * (docs/flow-control.md).
   */
  limits?: readonly Limit<StandardSchemaV1.InferInput<S>>[];
  /** Ready tasks of different fairness keys in a queue are claimed round-robin. */
  fairness?: Fairness<StandardSchemaV1.InferInput<S>>;
}

/** A defined task. Pass it to `enqueue` and to the passes that run it. */
export interface Task<S extends InputSchema = InputSchema, O = unknown> {
  readonly name: string;
  readonly input: S;
  readonly run: TaskHandler<StandardSchemaV1.InferOutput<S>, O>;
  readonly maxAttempts: number;
  readonly backoff: BackoffOptions | ((attempt: number) => number);
  readonly timeoutMs: number;
  readonly queue: string;
  readonly priority: number;
  readonly keepSucceeded: boolean;
  /** Its limits and fairness, checked; null for a task without (the plain claim's). */
  readonly flow: Flow | null;
}

/** The input type `enqueue` takes for a task: its schema's input type. */
export type TaskInput<T> = T extends Task<infer S, unknown> ? StandardSchemaV1.InferInput<S> : never;
/** The output type a task's handler returns. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type TaskOutput<T> = T extends Task<any, infer O> ? Awaited<O> : never;

/** Any task, whatever its types. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyTask = Task<any, any>;

/** Largest number of attempts a task may have. Keeps a row's error history bounded. */
export const MAX_ATTEMPTS_LIMIT = 1000;
/** Attempts cut short by their pass, not the handler, that a task survives. */
export const MAX_INTERRUPTIONS = 20;
/** Snoozes a task may take before it fails, so a bug cannot loop forever. */
export const MAX_SNOOZES = 1_000;
/** Longest timeout a task may declare: a day. */
export const MAX_TIMEOUT_MS = 86_400_000;

/** Checks a max-attempts value. */
export function checkMaxAttempts(value: unknown, where: string, ErrorType: new (m: string) => Error = ConfigError): number {
  return checkWhole(`${where}: maxAttempts`, value, { min: 1, max: MAX_ATTEMPTS_LIMIT }, ErrorType);
}

/**
 * Defines a task. Its `input` is any Standard Schema; zod is the default the
 * examples use, and a valibot or ArkType schema works the same way:
 * `input: v.object({ userId: v.string() })`.
 *
 * ```ts
 * const sendWelcome = defineTask({
 *   name: 'send-welcome',
 *   input: z.object({ userId: z.string() }),
 *   retry: { maxAttempts: 8, backoff: { baseMs: 2_000 } },
 *   async run({ userId }, ctx) {
 *     await mailer.send(userId, { signal: ctx.signal });
 *     return { sentAt: new Date().toISOString() };
 *   },
 * });
 * ```
 */
export function defineTask<S extends InputSchema, O>(config: TaskConfig<S, O>): Task<S, O> {
  const name = checkName('task', config.name);
  const why = notASchema(config.input);
  if (why) throw new ConfigError(`outlive: task "${name}" needs an input schema (${why}): ${SCHEMA_FIX}`);
  if (typeof config.run !== 'function') {
    throw new ConfigError(`outlive: task "${name}" needs a handler: pass \`run: async (input, ctx) => output\``);
  }
  const maxAttempts = checkMaxAttempts(config.retry?.maxAttempts ?? 5, `task "${name}"`);
  const timeoutMs = config.timeoutMs ?? 15_000;
  if (!isWhole(timeoutMs, { min: 1, max: MAX_TIMEOUT_MS })) {
    throw new ConfigError(`outlive: task "${name}": timeoutMs must be a whole number of milliseconds from 1 to ${MAX_TIMEOUT_MS}`);
  }
  const priority = config.priority ?? 0;
  if (!isWhole(priority)) throw new ConfigError(`outlive: task "${name}": priority must be a whole number`);
  const keepSucceeded = config.keepSucceeded ?? true;
  if (typeof keepSucceeded !== 'boolean') throw new ConfigError(`outlive: task "${name}": keepSucceeded must be true or false`);
  return Object.freeze({
    name,
    input: config.input,
    run: config.run,
    maxAttempts,
    backoff: config.retry?.backoff ?? {},
    timeoutMs,
    queue: checkName('queue', config.queue ?? 'default'),
    priority,
    keepSucceeded,
    flow: checkFlow(name, config.limits, config.fairness),
  });
}

/** Tasks a pass can run, found by name. */
export type TaskList = readonly AnyTask[] | ReadonlyMap<string, AnyTask>;

/** Indexes a task list by name, refusing two definitions under one name. */
export function taskRegistry(tasks: TaskList): ReadonlyMap<string, AnyTask> {
  if (tasks instanceof Map) return tasks;
  const map = new Map<string, AnyTask>();
  for (const task of tasks as readonly AnyTask[]) {
    const existing = map.get(task.name);
    if (existing && existing !== task) {
      throw new ConfigError(`outlive: two tasks are named "${task.name}": task names must be unique`);
    }
    map.set(task.name, task);
  }
  return map;
}
