/**
 * Waits: steps that wait for a signal (`waitFor`) or a time (`sleepStep`).
 * Each is a row of the built-in task {@link WAIT_TASK}, which every pass
 * claims and none runs a handler for: the pass begins it in the database
 * (`outlive.begin_waits`, src/pass/wait.ts), where it ends with its signal or
 * its deadline, or parks until one comes, holding no lease and costing no
 * write (ARCHITECTURE.md, "Waits and signals").
 */
import type { StandardSchemaV1 } from '@standard-schema/spec';
import { InvalidGraphError } from './errors.js';
import { isWhole } from './checks.js';
import type { Step, StepOptions } from './step.js';
import type { Task } from './task.js';
import { storableText } from './json.js';

/** The name of the built-in task of waits; `$` is refused in a task's own name, so it can be no one else's. */
export const WAIT_TASK = '$wait';

/** Longest a wait may wait, and the longest a signal is kept for a wait not yet begun: 365 days. */
export const MAX_WAIT_MS = 365 * 86_400_000;
/** How long a wait waits for its signal unless told: a day. */
export const DEFAULT_WAIT_TIMEOUT_MS = 86_400_000;
/** Longest signal key. */
export const MAX_SIGNAL_KEY = 500;

/** What a wait's row keeps as its input. */
export type WaitInput =
  | { key: string; timeoutMs: number; onTimeout?: { value: unknown } }
  | { ms: number }
  | { until: string };

// The row's input was checked when the step was made; the pass checks the
// shape again, as it would a task's, so a row edited by hand fails clearly.
const waitInputSchema: StandardSchemaV1<WaitInput, WaitInput> = {
  '~standard': {
    version: 1,
    vendor: 'outlive',
    validate(value) {
      const v = value as Record<string, unknown> | null;
      const ok =
        !!v && typeof v === 'object' &&
        ((typeof v.key === 'string' && isWhole(v.timeoutMs, { min: 0, max: MAX_WAIT_MS })) ||
          isWhole(v.ms, { min: 0, max: MAX_WAIT_MS }) ||
          (typeof v.until === 'string' && !Number.isNaN(Date.parse(v.until))));
      return ok ? { value: v as WaitInput } : { issues: [{ message: 'not the input of a wait: { key, timeoutMs }, { ms } or { until }' }] };
    },
  },
};

/**
 * The built-in task of waits. Its timeout bounds what a pass gives one
 * begin (a statement), not the wait; it retries a begin the database failed.
 */
export const waitTask: Task<typeof waitInputSchema, unknown> = Object.freeze({
  name: WAIT_TASK,
  input: waitInputSchema,
  run() {
    throw new Error('outlive: a wait has no handler: the pass begins it (src/pass/wait.ts)');
  },
  maxAttempts: 10,
  backoff: {},
  // Short, so a pass with little budget left still begins waits (a statement each claim).
  timeoutMs: 1_000,
  queue: 'default',
  priority: 0,
  keepSucceeded: true,
  flow: null,
});

/** Options of a step that waits: where it sits in its run, and its queue and priority when it is due. */
export type WaitStepOptions = Pick<StepOptions, 'after' | 'queue' | 'priority'>;

/** Options of {@link waitFor}. */
export interface WaitForOptions extends WaitStepOptions {
  /** How long to wait for the signal once the wait begins (its `after` steps done). Default a day; at most 365 days. */
  timeoutMs?: number;
  /**
   * What the wait becomes when no signal came in time: `'fail'` (the
   * default: the step fails with a {@link WaitTimeoutError}, and its run
   * with it) or `{ value }`, success with that output.
   */
  onTimeout?: 'fail' | { value: unknown };
}

const STEP_KEYS = ['after', 'queue', 'priority'];

function stepOptions(where: string, options: Record<string, unknown>, own: readonly string[]): StepOptions {
  if (!options || typeof options !== 'object') throw new InvalidGraphError(`outlive: ${where}: options must be an object`);
  const unknown = Object.keys(options).filter((k) => !STEP_KEYS.includes(k) && !own.includes(k));
  if (unknown.length) throw new InvalidGraphError(`outlive: ${where}: unknown option(s) ${unknown.join(', ')}: use ${[...own, ...STEP_KEYS].join(', ')}`);
  const out: StepOptions = {};
  if (options.after !== undefined) out.after = options.after as string[];
  if (options.queue !== undefined) out.queue = options.queue as string;
  if (options.priority !== undefined) out.priority = options.priority as number;
  return out;
}

/**
 * A step that waits for a signal: `signal(tx, key, payload)` from anywhere
 * ends it, and its payload becomes the step's output (read downstream with
 * `ctx.output(step)`). A signal sent before the wait begins is kept (see
 * `signal`'s `keepMs`) and taken when it does; the same signal id twice is
 * one signal.
 *
 * ```ts
 * verified: waitFor(`dns:${domain}`, { after: ['request'], timeoutMs: 86_400_000 }),
 * ```
 */
export function waitFor(key: string, options: WaitForOptions = {}): Step<typeof waitTask> {
  const where = `waitFor(${JSON.stringify(key)})`;
  checkSignalKey(key, InvalidGraphError, 'waitFor');
  const base = stepOptions(where, options as Record<string, unknown>, ['timeoutMs', 'onTimeout']);
  const timeoutMs = options.timeoutMs ?? DEFAULT_WAIT_TIMEOUT_MS;
  if (!isWhole(timeoutMs, { min: 0, max: MAX_WAIT_MS })) {
    throw new InvalidGraphError(`outlive: ${where}: timeoutMs must be a whole number of milliseconds from 0 to ${MAX_WAIT_MS}`);
  }
  const onTimeout = options.onTimeout ?? 'fail';
  const input: WaitInput = { key, timeoutMs };
  if (onTimeout !== 'fail') {
    if (!onTimeout || typeof onTimeout !== 'object' || !('value' in onTimeout) || Object.keys(onTimeout).length !== 1) {
      throw new InvalidGraphError(`outlive: ${where}: onTimeout must be 'fail' or { value }`);
    }
    input.onTimeout = { value: onTimeout.value };
  }
  return { task: waitTask, input, options: base };
}

/**
 * A step that waits for a time: `{ until }` a date, or `{ ms }` from when
 * it begins (its `after` steps done). Its output is null.
 *
 * ```ts
 * later: sleepStep({ until: tomorrowAt9 }, { after: ['verified'] }),
 * ```
 */
export function sleepStep(when: { until: Date } | { ms: number }, options: WaitStepOptions = {}): Step<typeof waitTask> {
  const base = stepOptions('sleepStep', options as Record<string, unknown>, []);
  const w = when as { until?: unknown; ms?: unknown };
  if (w && w.until instanceof Date && !Number.isNaN(w.until.getTime()) && w.ms === undefined) {
    // Due at its time: a sleep begun then ends at once, with no park between.
    return { task: waitTask, input: { until: w.until.toISOString() }, options: { ...base, runAt: w.until } };
  }
  if (w && isWhole(w.ms, { min: 0, max: MAX_WAIT_MS }) && w.until === undefined) return { task: waitTask, input: { ms: w.ms }, options: base };
  throw new InvalidGraphError(`outlive: sleepStep takes { until: Date } or { ms } with ms a whole number from 0 to ${MAX_WAIT_MS}`);
}

/** Checks a signal key: 1 to 500 characters of storable text. */
export function checkSignalKey(key: unknown, ErrorType: new (m: string) => Error, where: string): string {
  if (typeof key !== 'string' || key.length === 0 || key.length > MAX_SIGNAL_KEY || storableText(key) !== key) {
    throw new ErrorType(`outlive: ${where}: a signal key must be a string of 1 to ${MAX_SIGNAL_KEY} characters without NUL or unpaired surrogates, got ${JSON.stringify(key)}`);
  }
  return key;
}

/** What a wait that timed out without `onTimeout: { value }` fails with. */
export class WaitTimeoutError extends Error {
  constructor(key: string, timeoutMs: number) {
    super(`no signal "${key}" came within ${timeoutMs} ms`);
    this.name = 'WaitTimeoutError';
  }
}
