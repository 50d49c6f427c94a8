/**
 * Steps: a task, its input and the steps it waits for, as a run is made of
 * them (startRun) and as a running task adds them (ctx.spawn); checked and
 * serialised here before any is written.
 */
import { InvalidGraphError } from './errors.js';
import { checkGraph, checkStepName } from './graph.js';
import { prepareOptions, rowFlow, serialiseInput, type EnqueueOptions, type Prepared } from './row.js';
import type { AnyTask, TaskInput } from './task.js';

/** Options of one step: as enqueue's, with the steps it waits for. */
export interface StepOptions extends Pick<EnqueueOptions, 'priority' | 'queue' | 'maxAttempts' | 'timeoutMs' | 'runAt'> {
  /** Steps of the same run that must succeed before this one may start. */
  after?: readonly string[];
}

/** One step of a run: a task, its input and what it waits for. Make it with {@link step}. */
export interface Step<T extends AnyTask = AnyTask> {
  readonly task: T;
  readonly input: TaskInput<T>;
  readonly options: StepOptions;
}

/**
 * Describes one step of a run, typed from the task's schema.
 *
 * ```ts
 * step(importPage, { url }, { after: ['crawl'] })
 * ```
 */
export function step<T extends AnyTask>(task: T, input: TaskInput<T>, options: StepOptions = {}): Step<T> {
  return { task, input, options };
}

/** A step checked and serialised, ready to be written as a task row. */
export interface PreparedStep extends Omit<Prepared, 'delayMs' | 'keyMode'> {
  step: string;
  input: string;
  after: string[];
  /** Its fairness key ('' with limits only), or null for a task without flow control. */
  fairKey: string | null;
  /** Its limits as JSON, or null. */
  limits: string | null;
}

/** Checks one step (name, options, input) without touching the database. */
export function prepareStep(where: string, name: string, spec: Step): PreparedStep {
  checkStepName(name, where);
  if (!spec || typeof spec !== 'object' || !spec.task) {
    throw new InvalidGraphError(`outlive: ${where}: step "${name}" must be made with step(task, input, options)`);
  }
  const o = prepareOptions(spec.task, spec.options ?? {});
  const after = spec.options?.after ?? [];
  if (!Array.isArray(after)) throw new InvalidGraphError(`outlive: ${where}: step "${name}": after must be an array of step names`);
  for (const dep of after) checkStepName(dep, `${where}: step "${name}" waits for`);
  return {
    step: name,
    name: o.name,
    queue: o.queue,
    priority: o.priority,
    maxAttempts: o.maxAttempts,
    timeoutMs: o.timeoutMs,
    runAt: o.runAt,
    input: serialiseInput(spec.task, spec.input),
    after: [...new Set(after)],
    ...flowColumns(spec.task, spec.input),
  };
}

function flowColumns(task: AnyTask, input: unknown): { fairKey: string | null; limits: string | null } {
  const flow = rowFlow(task, input);
  return { fairKey: flow?.fairKey ?? null, limits: flow?.limits ?? null };
}

/** Largest number of steps one startRun or one task's spawns may write. */
export const MAX_STEPS_PER_WRITE = 100_000;

/** Checks a whole graph of steps and serialises it. Throws before anything is written. */
export function prepareGraph(where: string, steps: Record<string, Step>, external: ReadonlySet<string> = new Set()): PreparedStep[] {
  if (!steps || typeof steps !== 'object') throw new InvalidGraphError(`outlive: ${where}: steps must be an object of step(...)s`);
  const names = Object.keys(steps);
  if (names.length === 0) throw new InvalidGraphError(`outlive: ${where}: a run needs at least one step`);
  if (names.length > MAX_STEPS_PER_WRITE) {
    throw new InvalidGraphError(`outlive: ${where}: ${names.length} steps is over the limit of ${MAX_STEPS_PER_WRITE} in one write`);
  }
  const prepared = names.map((name) => prepareStep(where, name, steps[name]!));
  checkGraph(where, new Map(prepared.map((p) => [p.step, p.after])), external);
  return prepared;
}

/**
 * The columns of steps as the statements that insert them take them, one
 * array each: step, name, queue, priority, max attempts, timeout, run at,
 * input. Their flow control is {@link stepFlowColumns}.
 */
export function stepColumns(steps: readonly PreparedStep[]): unknown[][] {
  return [
    steps.map((s) => s.step),
    steps.map((s) => s.name),
    steps.map((s) => s.queue),
    steps.map((s) => s.priority),
    steps.map((s) => s.maxAttempts),
    steps.map((s) => s.timeoutMs),
    steps.map((s) => s.runAt),
    steps.map((s) => s.input),
  ];
}

/** The fairness keys and limits of steps, one array each (nulls for tasks without flow control). */
export function stepFlowColumns(steps: readonly PreparedStep[]): unknown[][] {
  return [steps.map((s) => s.fairKey), steps.map((s) => s.limits)];
}

/** The edges of steps as two parallel arrays: each `children[i]` waits for `parents[i]`. */
export function stepEdges(steps: readonly PreparedStep[]): { children: string[]; parents: string[] } {
  const children: string[] = [];
  const parents: string[] = [];
  for (const s of steps) {
    for (const dep of s.after) {
      children.push(s.step);
      parents.push(dep);
    }
  }
  return { children, parents };
}
