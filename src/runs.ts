/**
 * Runs: a graph of tasks started as one unit, inside the caller's
 * transaction. A task of a run becomes claimable only when every task it
 * waits for has succeeded; the run finishes when its last task does.
 */
import { prepareOptions, serialiseInput, type EnqueueOptions } from './enqueue.js';
import { InvalidGraphError } from './errors.js';
import { toExecutor, type Transactional } from './executor.js';
import { checkGraph, checkStepName } from './graph.js';
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
export interface PreparedStep {
  step: string;
  name: string;
  queue: string;
  priority: number;
  maxAttempts: number;
  timeoutMs: number;
  runAt: Date | null;
  input: string;
  after: string[];
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
  };
}

/** Largest number of steps one startRun or one task's spawns may write. */
export const MAX_STEPS_PER_WRITE = 100_000;

// The run, its tasks and their edges in one statement, so startRun is atomic
// even when given a pool instead of a transaction. A task's waiting_on starts
// at its number of dependencies; each success decrements it.
//
// Edges find their tasks' ids in one jsonb object of step -> id, not by
// joining the inserted rows by step: the planner cannot see that steps are
// unique there, estimated the join of a 10,000-task fan-out at 50 million
// rows, and that estimate switched on JIT compilation, 290 ms of the
// statement's 870 (bench dag phase, PostgreSQL 15 with its default
// jit_above_cost).
const START_RUN_SQL = `
WITH run AS (
  INSERT INTO outlive.runs (name, unfinished) VALUES ($1, $2) RETURNING id
), ins AS (
  INSERT INTO outlive.tasks (run_id, step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on)
  SELECT run.id, s.step, s.name, s.queue, s.priority, s.max_attempts, s.timeout_ms, coalesce(s.run_at, now()), s.input::jsonb, s.waiting_on
  FROM run, unnest($3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::int[], $9::timestamptz[], $10::text[], $11::int[])
       AS s(step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on)
  RETURNING id, step
), ids AS (
  SELECT jsonb_object_agg(step, id) AS of FROM ins
), edges AS (
  INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
  SELECT run.id, (ids.of ->> e.child)::bigint, (ids.of ->> e.parent)::bigint
  FROM run, ids, unnest($12::text[], $13::text[]) AS e(child, parent)
)
SELECT (SELECT id::text FROM run) AS run_id, id::text AS id, step FROM ins`;

/** A run as startRun wrote it. */
export interface StartedRun {
  id: string;
  /** Task id of each step. */
  tasks: Record<string, string>;
}

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
 * Starts a run: writes it and all its steps, with their dependencies, inside
 * the caller's transaction (one statement, so it is atomic on a pool too).
 *
 * ```ts
 * const run = await startRun(tx, 'import-site', {
 *   crawl: step(crawlSitemap, { siteId, url }),
 * });
 * ```
 *
 * A run with no steps, a step waiting for a step not in the run, a cycle, or
 * an invalid input throws {@link InvalidGraphError} / `InvalidEnqueueError`
 * and writes nothing.
 */
export async function startRun(tx: Transactional, name: string, steps: Record<string, Step>): Promise<StartedRun> {
  const { text, values } = startRunStatement(name, steps);
  const rows = await toExecutor(tx).query<{ run_id: string; id: string; step: string }>(text, values);
  return { id: rows[0]!.run_id, tasks: Object.fromEntries(rows.map((r) => [r.step, r.id])) };
}

/** The one statement that writes a run: checks the graph and throws before anything is sent. */
export function startRunStatement(name: string, steps: Record<string, Step>): { text: string; values: unknown[] } {
  checkStepName(name, 'startRun: run name');
  const prepared = prepareGraph(`startRun "${name}"`, steps);
  const { children, parents } = stepEdges(prepared);
  return {
    text: START_RUN_SQL,
    values: [name, prepared.length, ...stepColumns(prepared), prepared.map((p) => p.after.length), children, parents],
  };
}

/**
 * The columns of steps as the statements that insert them take them, one
 * array each: step, name, queue, priority, max attempts, timeout, run at,
 * input.
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
