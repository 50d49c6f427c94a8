/**
 * A run of any size at a glance: its steps grouped by name ("page:*" for
 * page:1 … page:10000) with counts by state and each group's first error,
 * and a timeline of when its steps started and ended, in buckets. Each is one
 * aggregate in Postgres over the run's rows (its (run_id, step) index), so
 * what reaches the caller is as small for 100,000 steps as for 10.
 */
import { toExecutor, toPool, type Database } from '../db/executor.js';
import { TASK_STATES, type RunState, type TaskState } from '../model/states.js';

/** Steps whose names share a prefix. */
export interface StepGroup {
  /** `page:*` (the name up to its first `:`), `shard-*` (trailing digits dropped), or the step's whole name. */
  prefix: string;
  /** What to search the steps by to list the group's: `page:`, `shard-`, or the whole name. */
  search: string;
  total: number;
  counts: Record<TaskState, number>;
  /** The group's first failed step (lowest id) and its error, if any failed. */
  firstError: { taskId: string; step: string; error: string | null } | null;
}

/** A run's row and its steps by group. */
export interface RunGroups {
  id: string;
  name: string;
  state: RunState;
  error: string | null;
  createdAt: Date;
  finishedAt: Date | null;
  /** Its tasks by state (every state present). */
  counts: Record<TaskState, number>;
  total: number;
  /** The largest groups first, at most `limit`. */
  groups: StepGroup[];
  /** Groups beyond `limit`, not listed. */
  moreGroups: number;
  now: Date;
}

// The group of a step: its name up to its first ':', else without its
// trailing digits, else its whole name; rtrim, not a regular expression,
// which cost three times as much per row (docs/benchmarks.md, "The dashboard at scale").
const GROUPS_SQL = `
SELECT g.search, g.search OPERATOR(pg_catalog.<>) g.whole AS partial, g.state::text, pg_catalog.count(*)::int AS n,
       pg_catalog.min(g.id) FILTER (WHERE g.state OPERATOR(pg_catalog.=) 'failed')::text AS first_failed
FROM (
  SELECT t.id, t.state, w.whole,
         CASE WHEN pg_catalog.strpos(w.whole, ':') OPERATOR(pg_catalog.>) 0 THEN pg_catalog.left(w.whole, pg_catalog.strpos(w.whole, ':'))
              WHEN pg_catalog.rtrim(w.whole, '0123456789') OPERATOR(pg_catalog.=) '' THEN w.whole
              ELSE pg_catalog.rtrim(w.whole, '0123456789') END AS search
  FROM outlive.tasks t CROSS JOIN LATERAL (SELECT coalesce(t.step, t.name) AS whole) w
  WHERE t.run_id OPERATOR(pg_catalog.=) $1
) g
GROUP BY 1, 2, 3`;

const RUN_SQL = `
SELECT id::text, name, state::text, error, created_at, finished_at, coalesce($2::timestamptz, pg_catalog.now()) AS now
FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`;

function zeroes(): Record<TaskState, number> {
  return Object.fromEntries(TASK_STATES.map((s) => [s, 0])) as Record<TaskState, number>;
}

/** What changes in a run's row when its tasks can change after it finished (a retry reopens it); null if there is no such run. */
export async function runVersion(db: Database, runId: string): Promise<{ state: RunState; updatedAt: Date; unfinished: number } | null> {
  const [row] = await toExecutor(toPool(db)).query<{ state: RunState; updated_at: Date; unfinished: number }>(
    `SELECT state::text, updated_at, unfinished FROM outlive.runs WHERE id OPERATOR(pg_catalog.=) $1`,
    [runId],
  );
  return row ? { state: row.state, updatedAt: row.updated_at, unfinished: row.unfinished } : null;
}

/** A run with its steps grouped by name (the largest `limit` groups); null if there is no such run. */
export async function runGroups(db: Database, runId: string, options: { limit?: number; now?: Date } = {}): Promise<RunGroups | null> {
  const exec = toExecutor(toPool(db));
  const [run] = await exec.query<{ id: string; name: string; state: RunState; error: string | null; created_at: Date; finished_at: Date | null; now: Date }>(
    RUN_SQL,
    [runId, options.now ?? null],
  );
  if (!run) return null;
  const rows = await exec.query<{ search: string; partial: boolean; state: TaskState; n: number; first_failed: string | null }>(GROUPS_SQL, [runId]);
  const byPrefix = new Map<string, StepGroup & { failedId: bigint | null }>();
  const counts = zeroes();
  let total = 0;
  for (const r of rows) {
    const prefix = r.partial ? `${r.search}*` : r.search;
    let g = byPrefix.get(prefix);
    if (!g) byPrefix.set(prefix, (g = { prefix, search: r.search, total: 0, counts: zeroes(), firstError: null, failedId: null }));
    g.total += r.n;
    g.counts[r.state] += r.n;
    counts[r.state] += r.n;
    total += r.n;
    if (r.first_failed !== null && (g.failedId === null || BigInt(r.first_failed) < g.failedId)) g.failedId = BigInt(r.first_failed);
  }
  const limit = options.limit ?? 50;
  const all = [...byPrefix.values()].sort((a, b) => b.total - a.total || (a.prefix < b.prefix ? -1 : 1));
  const shown = all.slice(0, limit);
  const failedIds = shown.filter((g) => g.failedId !== null).map((g) => String(g.failedId));
  const errors = new Map(
    (failedIds.length === 0
      ? []
      : await exec.query<{ id: string; step: string; last_error: string | null }>(
          `SELECT id::text, coalesce(step, name) AS step, last_error FROM outlive.tasks WHERE id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`,
          [failedIds],
        )
    ).map((e) => [e.id, e]),
  );
  return {
    id: run.id,
    name: run.name,
    state: run.state,
    error: run.error,
    createdAt: run.created_at,
    finishedAt: run.finished_at,
    counts,
    total,
    groups: shown.map(({ failedId, ...g }) => {
      const e = failedId === null ? undefined : errors.get(String(failedId));
      return { ...g, firstError: e ? { taskId: e.id, step: e.step, error: e.last_error } : null };
    }),
    moreGroups: all.length - shown.length,
    now: run.now,
  };
}

/** When a run's steps started and ended: one bar per step for a small run, else counts per time bucket. */
export type RunTimeline =
  | { kind: 'empty' }
  | { kind: 'steps'; from: Date; to: Date; steps: { taskId: string; step: string; state: TaskState; startedAt: Date; finishedAt: Date | null }[] }
  | { kind: 'buckets'; from: Date; to: Date; buckets: { started: number; succeeded: number; failed: number; other: number }[] };

const SPAN_SQL = `
SELECT pg_catalog.min(t.started_at) AS lo,
       GREATEST(pg_catalog.max(t.started_at), pg_catalog.max(t.finished_at) FILTER (WHERE t.started_at IS NOT NULL)) AS hi,
       pg_catalog.count(t.started_at)::int AS n,
       coalesce($2::timestamptz, pg_catalog.now()) AS now
FROM outlive.tasks t WHERE t.run_id OPERATOR(pg_catalog.=) $1`;

// Each step counted twice at most, in one read of the run's rows: once in
// the bucket it started in, once in the bucket it finished in (by how).
const BUCKETS_SQL = `
SELECT LEAST(GREATEST(e.b, 1), $4::int) AS b, e.what, pg_catalog.count(*)::int AS n
FROM outlive.tasks t
CROSS JOIN LATERAL (VALUES
  (pg_catalog.width_bucket(extract(epoch FROM t.started_at)::float8, $2::float8, $3::float8, $4::int), 'started'),
  (pg_catalog.width_bucket(extract(epoch FROM t.finished_at)::float8, $2::float8, $3::float8, $4::int),
   CASE WHEN t.state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'failed']::outlive.task_state[]) THEN t.state::text ELSE 'other' END)
) AS e(b, what)
WHERE t.run_id OPERATOR(pg_catalog.=) $1 AND t.started_at IS NOT NULL AND e.b IS NOT NULL
GROUP BY 1, 2`;

/** Steps shown one bar each at most; a run with more is shown in buckets. */
export const TIMELINE_STEPS = 60;

/** A run's timeline: its steps that started, one bar each up to {@link TIMELINE_STEPS}, else in `buckets` buckets of time. */
export async function runTimeline(db: Database, runId: string, options: { buckets?: number; now?: Date } = {}): Promise<RunTimeline> {
  const exec = toExecutor(toPool(db));
  const [span] = await exec.query<{ lo: Date | null; hi: Date | null; n: number; now: Date }>(SPAN_SQL, [runId, options.now ?? null]);
  if (!span || span.lo === null || span.hi === null) return { kind: 'empty' };
  // A step still running ends the timeline at now.
  const to = new Date(Math.max(span.hi.getTime(), span.lo.getTime() + 1000));
  if (span.n <= TIMELINE_STEPS) {
    const steps = await exec.query<{ id: string; step: string; state: TaskState; started_at: Date; finished_at: Date | null }>(
      `SELECT id::text, coalesce(step, name) AS step, state::text, started_at, finished_at FROM outlive.tasks
       WHERE run_id OPERATOR(pg_catalog.=) $1 AND started_at IS NOT NULL ORDER BY started_at, id`,
      [runId],
    );
    const end = steps.some((s) => s.finished_at === null) ? new Date(Math.max(to.getTime(), span.now.getTime())) : to;
    return { kind: 'steps', from: span.lo, to: end, steps: steps.map((s) => ({ taskId: s.id, step: s.step, state: s.state, startedAt: s.started_at, finishedAt: s.finished_at })) };
  }
  const n = options.buckets ?? 60;
  const lo = span.lo.getTime() / 1000;
  const hi = to.getTime() / 1000 + 1e-6;
  const rows = await exec.query<{ b: number; what: 'started' | 'succeeded' | 'failed' | 'other'; n: number }>(BUCKETS_SQL, [runId, lo, hi, n]);
  const buckets = Array.from({ length: n }, () => ({ started: 0, succeeded: 0, failed: 0, other: 0 }));
  for (const r of rows) buckets[r.b - 1]![r.what] += r.n;
  return { kind: 'buckets', from: span.lo, to, buckets };
}
