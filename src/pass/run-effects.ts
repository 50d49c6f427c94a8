/**
 * Release: the knock-on effects of settling tasks that belong to runs, written
 * in the same transaction as the settle itself.
 *
 * - a success decrements `waiting_on` of the tasks that already waited for
 *   it (at 0 they become claimable), then writes what the task spawned;
 * - a failure for good marks every task downstream of it `skipped`, and
 *   records it as the task that failed its run;
 * - every run touched has its count of unfinished tasks adjusted, and takes
 *   its final state when the count reaches 0.
 *
 * Rows are locked in id order in every statement here, and runs after tasks,
 * so concurrent settles of one run queue up rather than deadlock.
 */
import { InvalidGraphError } from '../model/errors.js';
import type { Executor } from '../db/executor.js';
import { stepColumns, stepEdges, stepFlowColumns, type PreparedStep } from '../model/step.js';

/** A settled row of a run, as the knock-on effects need it. */
export interface RunRow {
  id: string;
  state: string;
  run_id: string | null;
  step: string | null;
}

// Decrement each dependent once per dependency that just succeeded, and
// NOTIFY for those this made ready: a function (migration 0017), since a
// signal settling a wait runs the same statement.
const RELEASE_SQL = 'SELECT ready, notified FROM outlive.release_dependents($1::bigint[], $2::timestamptz)';

// Every pending task downstream of a failed one: none of them can ever start.
const SKIP_SQL = `
WITH RECURSIVE down(id) AS (
  SELECT task_id FROM outlive.task_deps WHERE depends_on OPERATOR(pg_catalog.=) $1::bigint
  UNION
  SELECT d.task_id FROM outlive.task_deps d JOIN down ON d.depends_on OPERATOR(pg_catalog.=) down.id
), locked AS (
  SELECT t.id FROM outlive.tasks t WHERE t.id OPERATOR(pg_catalog.=) ANY (SELECT id FROM down) AND t.state OPERATOR(pg_catalog.=) 'pending'
  ORDER BY t.id FOR UPDATE
)
UPDATE outlive.tasks t
SET state = 'skipped', last_error = $3, finished_at = coalesce($2::timestamptz, pg_catalog.now()), updated_at = coalesce($2::timestamptz, pg_catalog.now())
FROM locked WHERE t.id OPERATOR(pg_catalog.=) locked.id
RETURNING t.id::text`;

// Each run's unfinished count moved, its final state taken at 0 (migration 0017; a signal runs it too).
const HAS_DEPENDENTS_SQL = `
SELECT DISTINCT depends_on::text AS id FROM outlive.task_deps WHERE depends_on OPERATOR(pg_catalog.=) ANY ($1::bigint[])`;

const FINISH_RUNS_SQL = 'SELECT outlive.finish_runs($1::timestamptz, $2::bigint[], $3::int[], $4::bigint[], $5::text[])';

// Steps a spawn refers to (or would collide with) are locked first, so a
// dependency that is settling right now either committed already (and is
// seen as succeeded) or waits and then finds the new edge to release.
const LOCK_STEPS_SQL = `
SELECT id::text, step, state::text FROM outlive.tasks
WHERE run_id OPERATOR(pg_catalog.=) $1 AND step OPERATOR(pg_catalog.=) ANY ($2::text[])
ORDER BY id FOR UPDATE`;

const INSERT_SPAWNS_SQL = `
WITH ins AS (
  INSERT INTO outlive.tasks (run_id, step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on, state, last_error, finished_at,
                             fair_key, limits, trace_context)
  SELECT $1, s.step, s.name, s.queue, s.priority, s.max_attempts, s.timeout_ms, coalesce(s.run_at, pg_catalog.now()), s.input::jsonb, s.waiting_on,
         s.state::outlive.task_state, s.last_error, CASE WHEN s.state OPERATOR(pg_catalog.=) 'skipped' THEN coalesce($2::timestamptz, pg_catalog.now()) END,
         s.fair_key, s.limits::jsonb,
         -- The spawner's, which is its run's: spawned steps link to the run too.
         (SELECT p.trace_context FROM outlive.tasks p WHERE p.id OPERATOR(pg_catalog.=) $21::bigint)
  FROM ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::int[]),
                  pg_catalog.unnest($7::int[]), pg_catalog.unnest($8::int[]), pg_catalog.unnest($9::timestamptz[]), pg_catalog.unnest($10::text[]),
                  pg_catalog.unnest($11::int[]), pg_catalog.unnest($12::text[]), pg_catalog.unnest($13::text[]),
                  pg_catalog.unnest($19::text[]), pg_catalog.unnest($20::text[]))
       AS s(step, name, queue, priority, max_attempts, timeout_ms, run_at, input, waiting_on, state, last_error, fair_key, limits)
  RETURNING id, step
), ids AS (
  -- The spawned steps, and the steps already in the run that they wait for
  -- (a lookup object rather than a join: see START_RUN_SQL in src/write/start-run.ts).
  SELECT pg_catalog.jsonb_object_agg(step, id) AS of
  FROM (SELECT id, step FROM ins
        UNION ALL SELECT x.id, x.step FROM ROWS FROM (pg_catalog.unnest($16::bigint[]), pg_catalog.unnest($17::text[])) AS x(id, step)) a
), edges AS (
  INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
  SELECT $1, (ids.of OPERATOR(pg_catalog.->>) e.child)::bigint, (ids.of OPERATOR(pg_catalog.->>) e.parent)::bigint
  FROM ids, ROWS FROM (pg_catalog.unnest($14::text[]), pg_catalog.unnest($15::text[])) AS e(child, parent)
), unsure AS (
  INSERT INTO outlive.recounts (task_id) SELECT id FROM ins WHERE step OPERATOR(pg_catalog.=) ANY ($18::text[])
)
SELECT pg_catalog.count(*)::int AS n FROM ins`;

const BROKEN = new Set(['failed', 'skipped', 'cancelled']);

/**
 * Writes the steps a task spawned into its run. Returns how many of them are
 * unfinished (those born downstream of a failure are written as skipped).
 */
export async function insertSpawns(db: Executor, runId: string, spawner: string, steps: readonly PreparedStep[], now: Date | null): Promise<number> {
  const where = `task ${spawner} spawning into run ${runId}`;
  const fresh = new Map(steps.map((s) => [s.step, s]));
  const referenced = new Set<string>(fresh.keys());
  for (const s of steps) for (const dep of s.after) referenced.add(dep);
  const existing = await db.query<{ id: string; step: string; state: string }>(LOCK_STEPS_SQL, [runId, [...referenced]]);
  const byStep = new Map(existing.map((e) => [e.step, e]));
  for (const s of steps) {
    if (byStep.has(s.step)) throw new InvalidGraphError(`outlive: ${where}: step "${s.step}" already exists in the run`);
    for (const dep of s.after) {
      if (!fresh.has(dep) && !byStep.has(dep)) throw new InvalidGraphError(`outlive: ${where}: step "${s.step}" waits for "${dep}", which is not in the run`);
    }
  }
  // Born skipped: waits (directly or through other new steps) on a step
  // that can never succeed; spread from the broken ones along the new
  // steps' own edges, each edge once.
  const skipped = new Map<string, string>();
  const below = new Map<string, string[]>();
  const broken: string[] = [];
  for (const s of steps) {
    for (const dep of s.after) {
      if (fresh.has(dep)) (below.get(dep) ?? below.set(dep, []).get(dep)!).push(s.step);
      else if (!skipped.has(s.step) && BROKEN.has(byStep.get(dep)?.state ?? '')) {
        skipped.set(s.step, `not run: upstream step "${dep}" did not succeed`);
        broken.push(s.step);
      }
    }
  }
  while (broken.length > 0) {
    const dep = broken.pop()!;
    for (const child of below.get(dep) ?? []) {
      if (skipped.has(child)) continue;
      skipped.set(child, `not run: upstream step "${dep}" did not succeed`);
      broken.push(child);
    }
  }
  const waiting = steps.map((s) => unfinishedDependencies(s, fresh, byStep));
  const { children, parents } = stepEdges(steps);
  const parentSet = new Set(parents);
  const external = existing.filter((e) => parentSet.has(e.step));
  // A step running in another pass may be settled by a statement that took
  // its snapshot before this spawn committed (it waited for the lock held
  // here): that statement cannot see the new edges to release them. Rows
  // waiting for such a step are listed for recovery to recount.
  const unsure = steps.filter((s) => !skipped.has(s.step) && s.after.some((dep) => byStep.get(dep)?.state === 'running'));
  await db.query(INSERT_SPAWNS_SQL, [
    runId,
    now,
    ...stepColumns(steps),
    waiting,
    steps.map((s) => (skipped.has(s.step) ? 'skipped' : 'pending')),
    steps.map((s) => skipped.get(s.step) ?? null),
    children,
    parents,
    external.map((e) => e.id),
    external.map((e) => e.step),
    unsure.map((s) => s.step),
    ...stepFlowColumns(steps),
    spawner,
  ]);
  return steps.length - skipped.size;
}

/**
 * The one rule for a new row's `waiting_on`: its dependencies that have not
 * succeeded as the spawn sees them (their rows locked). Every transaction
 * releases the dependents of its successes before it writes spawns, so a
 * release never reaches a row written after it, and no success is counted
 * off a new row twice.
 */
function unfinishedDependencies(s: PreparedStep, fresh: ReadonlyMap<string, PreparedStep>, existing: ReadonlyMap<string, { state: string }>): number {
  let n = 0;
  for (const dep of s.after) if (fresh.has(dep) || existing.get(dep)!.state !== 'succeeded') n++;
  return n;
}

// Recounts the rows a spawn could not be sure would be released (see
// insertSpawns). Locked first, in a statement of their own, so the count
// that follows reads every release committed before the lock was granted; a
// release still waiting for the lock then decrements the recounted value.
// A row stays listed while a step it waits for is running, since that
// step's settle may be the statement that cannot see its edge; rows no
// longer pending leave the list.
const LOCK_RECOUNTS_SQL = `
WITH gone AS (
  DELETE FROM outlive.recounts r
  WHERE NOT EXISTS (SELECT 1 FROM outlive.tasks t WHERE t.id OPERATOR(pg_catalog.=) r.task_id AND t.state OPERATOR(pg_catalog.=) 'pending')
)
SELECT t.id::text FROM outlive.recounts r JOIN outlive.tasks t ON t.id OPERATOR(pg_catalog.=) r.task_id
WHERE t.state OPERATOR(pg_catalog.=) 'pending' ORDER BY t.id FOR UPDATE OF t`;

const RECOUNT_SQL = `
WITH counted AS (
  SELECT t.id, t.queue, t.waiting_on AS was,
         pg_catalog.count(*) FILTER (WHERE (p.state OPERATOR(pg_catalog.=) 'succeeded') IS NOT TRUE)::int AS n,
         pg_catalog.count(*) FILTER (WHERE p.state OPERATOR(pg_catalog.=) 'running')::int AS running
  FROM outlive.tasks t
  JOIN outlive.task_deps d ON d.task_id OPERATOR(pg_catalog.=) t.id
  LEFT JOIN outlive.tasks p ON p.id OPERATOR(pg_catalog.=) d.depends_on
  WHERE t.id OPERATOR(pg_catalog.=) ANY ($1::bigint[]) AND t.state OPERATOR(pg_catalog.=) 'pending'
  GROUP BY t.id
), upd AS (
  UPDATE outlive.tasks t SET waiting_on = c.n, updated_at = coalesce($2::timestamptz, pg_catalog.now())
  FROM counted c WHERE t.id OPERATOR(pg_catalog.=) c.id AND c.n OPERATOR(pg_catalog.<>) c.was
  RETURNING t.queue, t.waiting_on
), done AS (
  DELETE FROM outlive.recounts r USING counted c WHERE r.task_id OPERATOR(pg_catalog.=) c.id AND c.running OPERATOR(pg_catalog.=) 0
)
SELECT (SELECT pg_catalog.count(*) FROM upd)::int AS fixed,
       (SELECT pg_catalog.count(pg_catalog.pg_notify('outlive', q.queue))
        FROM (SELECT DISTINCT queue FROM upd WHERE waiting_on OPERATOR(pg_catalog.=) 0) q)::int AS notified`;

/**
 * Recounts `waiting_on` of the rows spawns listed as unsure, in the
 * transaction `db` is in; returns how many it corrected. Run by recovery.
 */
export async function recountWaits(db: Executor, now: Date | null): Promise<number> {
  const locked = await db.query<{ id: string }>(LOCK_RECOUNTS_SQL, []);
  if (locked.length === 0) return 0;
  const [r] = await db.query<{ fixed: number }>(RECOUNT_SQL, [locked.map((l) => l.id), now]);
  return r?.fixed ?? 0;
}

/**
 * Applies the knock-on effects of `rows` (just settled, or just failed by
 * recovery) in the transaction `db` is in. `spawns` holds what each
 * succeeded task spawned, by task id.
 */
export async function applyRunEffects(
  db: Executor,
  rows: readonly RunRow[],
  spawns: ReadonlyMap<string, readonly PreparedStep[]>,
  now: Date | null,
): Promise<void> {
  const runs = new Map<string, { delta: number; failedTask: string | null; error: string | null }>();
  const runOf = (id: string) => {
    let r = runs.get(id);
    if (!r) runs.set(id, (r = { delta: 0, failedTask: null, error: null }));
    return r;
  };
  const succeeded: RunRow[] = [];
  for (const row of rows) {
    if (!row.run_id || row.state === 'pending' || row.state === 'released' || row.state === 'snoozed') continue;
    runOf(row.run_id).delta -= 1;
    if (row.state === 'succeeded') succeeded.push(row);
  }
  // Release before spawning: see unfinishedDependencies.
  if (succeeded.length > 0) await db.query(RELEASE_SQL, [succeeded.map((r) => r.id), now]);
  for (const row of succeeded) {
    const spawned = spawns.get(row.id);
    if (spawned?.length) runOf(row.run_id!).delta += await insertSpawns(db, row.run_id!, row.id, spawned, now);
  }
  const failed = rows.filter((row) => row.run_id && row.state === 'failed');
  // Most failed steps have nothing downstream (a leaf, a wait that timed
  // out): one statement finds those that do. It sees every edge onto them: a
  // spawn adding one locks the step first, so it either committed before
  // this transaction's settle locked the row, or waits and sees it failed.
  const upstream = failed.length > 0 ? new Set((await db.query<{ id: string }>(HAS_DEPENDENTS_SQL, [failed.map((r) => r.id)])).map((r) => r.id)) : null;
  for (const row of failed) {
    const label = row.step ? `step "${row.step}" (task ${row.id})` : `task ${row.id}`;
    // Again until it finds nothing new: a statement that waited for a step's
    // lock (held by a spawn onto that step) read the edges as they were
    // before the spawn committed, and the next one, with a fresh snapshot,
    // finds the spawned rows below the step it skipped.
    let skipped = 0;
    while (upstream!.has(row.id)) {
      const more = await db.query(SKIP_SQL, [row.id, now, `not run: upstream ${label} failed`]);
      if (more.length === 0) break;
      skipped += more.length;
    }
    const run = runOf(row.run_id!);
    run.delta -= skipped;
    if (!run.failedTask) {
      run.failedTask = row.id;
      run.error = `${label} failed`;
    }
  }
  if (runs.size === 0) return;
  const ids = [...runs.keys()].sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1));
  await db.query(FINISH_RUNS_SQL, [
    now,
    ids,
    ids.map((id) => runs.get(id)!.delta),
    ids.map((id) => runs.get(id)!.failedTask),
    ids.map((id) => runs.get(id)!.error),
  ]);
}
