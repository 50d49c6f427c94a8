/**
 * Runs: a graph of tasks started as one unit, inside the caller's
 * transaction. A task of a run becomes claimable only when every task it
 * waits for has succeeded; the run finishes when its last task does.
 */
import { toExecutor, type Transactional } from '../db/executor.js';
import { checkStepName } from '../model/graph.js';
import { prepareGraph, stepColumns, stepEdges, stepFlowColumns, type PreparedStep, type Step } from '../model/step.js';
import { withSendSpan } from '../model/telemetry.js';

// The run, its tasks and their edges in one statement, so startRun is atomic
// even when given a pool instead of a transaction. A task's waiting_on starts
// at its number of dependencies; each success decrements it. A step with
// flow control is written unplaced (no vt): the claim places it in its
// fairness key's turn once it is ready (migration 0014).
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
  INSERT INTO outlive.tasks (run_id, step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on, fair_key, limits, trace_context)
  SELECT run.id, s.step, s.name, s.queue, s.priority, s.max_attempts, s.timeout_ms, coalesce(s.run_at, pg_catalog.now()), s.input::jsonb, s.waiting_on,
         s.fair_key, s.limits::jsonb, $16::text
  FROM run, ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::int[]),
                       pg_catalog.unnest($7::int[]), pg_catalog.unnest($8::int[]), pg_catalog.unnest($9::timestamptz[]), pg_catalog.unnest($10::text[]),
                       pg_catalog.unnest($11::int[]), pg_catalog.unnest($14::text[]), pg_catalog.unnest($15::text[]))
       AS s(step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on, fair_key, limits)
  RETURNING id, step
), ids AS (
  SELECT pg_catalog.jsonb_object_agg(step, id) AS of FROM ins
), edges AS (
  INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
  SELECT run.id, (ids.of OPERATOR(pg_catalog.->>) e.child)::bigint, (ids.of OPERATOR(pg_catalog.->>) e.parent)::bigint
  FROM run, ids, ROWS FROM (pg_catalog.unnest($12::text[]), pg_catalog.unnest($13::text[])) AS e(child, parent)
)
SELECT (SELECT id::text FROM run) AS run_id, id::text AS id, step FROM ins`;

/** A run as startRun wrote it. */
export interface StartedRun {
  id: string;
  /** Task id of each step. */
  tasks: Record<string, string>;
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
  checkStepName(name, 'startRun: run name');
  const prepared = prepareGraph(`startRun "${name}"`, steps);
  // Every step links to the run's one send span: many small traces, not one of the whole run.
  const rows = await withSendSpan({ task: name, queue: prepared[0]!.queue, count: prepared.length, run: name }, (trace) =>
    toExecutor(tx).query<{ run_id: string; id: string; step: string }>(START_RUN_SQL, startRunValues(name, prepared, trace)),
  );
  return { id: rows[0]!.run_id, tasks: Object.fromEntries(rows.map((r) => [r.step, r.id])) };
}

/** The one statement that writes a run: checks the graph and throws before anything is sent. */
export function startRunStatement(name: string, steps: Record<string, Step>): { text: string; values: unknown[] } {
  checkStepName(name, 'startRun: run name');
  return { text: START_RUN_SQL, values: startRunValues(name, prepareGraph(`startRun "${name}"`, steps), null) };
}

function startRunValues(name: string, prepared: PreparedStep[], trace: string | null): unknown[] {
  const { children, parents } = stepEdges(prepared);
  return [name, prepared.length, ...stepColumns(prepared), prepared.map((p) => p.after.length), children, parents, ...stepFlowColumns(prepared), trace];
}
