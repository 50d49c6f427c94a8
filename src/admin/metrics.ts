/**
 * What a monitoring system scrapes: each queue's depth by state and its lag
 * (the age of its oldest ready task), tasks blocked on limits, pauses, and
 * what finished in the last window. One snapshot, read by Prometheus's
 * `/metrics` (src/http/dashboard/metrics.ts) and OpenTelemetry's observable
 * gauges (src/otel/metrics.ts) alike.
 *
 * Every query reads the partial indexes of live rows the claim keeps
 * (migrations 0014, 0017) or a range of the finished index, never a count
 * over history: what a scrape costs grows with the tasks waiting and
 * running, not with the millions kept (docs/benchmarks.md, "Metrics").
 */
import { inTransaction, toPool, type Database, type Executor } from '../db/executor.js';
import { WAIT_TASK } from '../model/wait.js';

/** The states a queue's depth is counted in. */
export const DEPTH_STATES = [
  /** Pending, due, waiting on nothing: the next claim may take it. */
  'ready',
  /** Pending with `run_at` to come: delayed, backing off after a failure, snoozed. */
  'scheduled',
  /** Claimed by a pass. */
  'running',
  /** Pending and parked: a wait for a signal or a sleep (`$wait`), or a task blocked on a limit's key. */
  'waiting',
] as const;

/** A state a queue's depth is counted in. */
export type DepthState = (typeof DEPTH_STATES)[number];

/** The final states a finished task is counted in. */
export const FINISHED_STATES = ['succeeded', 'failed', 'cancelled', 'skipped'] as const;

/** A final state. */
export type FinishedState = (typeof FINISHED_STATES)[number];

/** The quantiles of the window's durations. */
export const QUANTILES = [0.5, 0.9, 0.99] as const;

/** One queue as the metrics see it. */
export interface QueueMetrics {
  queue: string;
  /** Tasks by state (every state present, zero when none). */
  depth: Record<DepthState, number>;
  /** Of the `waiting` ones, those blocked on a limit's key (concurrency, rate, a paused key). */
  blockedOnLimits: number;
  /** How long the oldest ready task has been due, in seconds; 0 when none is ready. */
  lagSeconds: number;
  /** True when the queue is paused (no claim takes its tasks). */
  paused: boolean;
  /** Tasks that reached each final state within the window (at most `sampleCap` each). */
  finished: Record<FinishedState, number>;
}

/** A quantile of some durations, in seconds; null when the window had none. */
export type Quantiles = Record<(typeof QUANTILES)[number], number | null>;

/** The whole system as a scrape reads it. */
export interface MetricsSnapshot {
  /** The clock the snapshot was read at (the database's unless given). */
  now: Date;
  /** Queues with a live task, a task finished within the window, or a pause; by name. */
  queues: QueueMetrics[];
  /** Limit keys paused now (by hand or after a 429). */
  keysPaused: number;
  /** The window `finished` and the durations are read over, in seconds. */
  windowSeconds: number;
  /** Rows read per final state at most: past it, counts and durations are of the latest `sampleCap` rows. */
  sampleCap: number;
  /** True when some final state reached `sampleCap` rows within the window (so it may have had more). */
  sampled: boolean;
  /** Attempt durations (`finished_at - started_at`) of tasks that succeeded or failed within the window; waits left out. */
  attemptSeconds: Quantiles;
  /** Start latencies (`started_at - run_at`: from due to claimed) of the same tasks' last attempts. */
  startLatencySeconds: Quantiles;
  /**
   * Of waits a signal ended within the window (among the latest `sampleCap`
   * successes), the time from the wait's end to the start of each step
   * waiting on it that has started (its last attempt's start).
   */
  signalToResumeSeconds: Quantiles;
}

/** How {@link readMetrics} reads. */
export interface MetricsOptions {
  /** The clock (default: the database's). Tests backdate rows rather than wait. */
  now?: Date;
  /** The window of finished tasks, in seconds (default 300). */
  windowSeconds?: number;
  /** Rows read per final state at most (default 10,000): bounds a scrape's cost at any throughput. */
  sampleCap?: number;
}

// Live rows, each branch one partial index (its predicate repeated so the
// planner matches it): plain pending rows (tasks_claim_idx, which parked
// waits and scheduled rows are in too), governed rows placed in turn
// (tasks_governed_idx) and not yet placed (tasks_unplaced_idx), rows blocked
// on a key (tasks_blocked_idx), running rows (tasks_lease_idx). Pending rows
// waiting on their dependencies (waiting_on > 0) are in no index of live
// rows, and are not counted.
const DEPTH_SQL = `
WITH clock AS (SELECT coalesce($1::timestamptz, pg_catalog.now()) AS now_at),
live AS (
  SELECT t.queue, t.name, t.run_at, false AS blocked FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.=) 0 AND t.fair_key IS NULL
  UNION ALL
  SELECT t.queue, t.name, t.run_at, false FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.=) 0 AND t.fair_key IS NOT NULL
    AND t.vt IS NOT NULL AND t.blocked_on IS NULL
  UNION ALL
  SELECT t.queue, t.name, t.run_at, false FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.waiting_on OPERATOR(pg_catalog.=) 0 AND t.fair_key IS NOT NULL
    AND t.vt IS NULL AND t.blocked_on IS NULL
  UNION ALL
  SELECT t.queue, t.name, t.run_at, true FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'pending' AND t.blocked_on IS NOT NULL
), pending AS (
  SELECT l.queue,
         pg_catalog.count(*) FILTER (WHERE NOT l.blocked AND l.run_at OPERATOR(pg_catalog.<=) c.now_at)::int AS ready,
         pg_catalog.count(*) FILTER (WHERE NOT l.blocked AND l.run_at OPERATOR(pg_catalog.>) c.now_at
                                       AND l.name OPERATOR(pg_catalog.<>) $2)::int AS scheduled,
         pg_catalog.count(*) FILTER (WHERE l.blocked OR (l.run_at OPERATOR(pg_catalog.>) c.now_at
                                       AND l.name OPERATOR(pg_catalog.=) $2))::int AS waiting,
         pg_catalog.count(*) FILTER (WHERE l.blocked)::int AS blocked,
         pg_catalog.min(l.run_at) FILTER (WHERE NOT l.blocked AND l.run_at OPERATOR(pg_catalog.<=) c.now_at) AS oldest
  FROM live l CROSS JOIN clock c
  GROUP BY l.queue
), running AS (
  SELECT t.queue, pg_catalog.count(*)::int AS running FROM outlive.tasks t
  WHERE t.state OPERATOR(pg_catalog.=) 'running'
  GROUP BY t.queue
)
SELECT coalesce(p.queue, r.queue) AS queue, coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(p.waiting, 0) AS waiting, coalesce(p.blocked, 0) AS blocked,
       coalesce(extract(epoch FROM (c.now_at OPERATOR(pg_catalog.-) p.oldest))::float8, 0) AS lag_seconds
FROM pending p FULL JOIN running r ON r.queue OPERATOR(pg_catalog.=) p.queue CROSS JOIN clock c`;

// The latest rows of each final state within the window, read backwards
// along tasks_state_finished_idx (state, finished_at): at most $3 each.
// Then, of those, the counts; the durations of attempts that succeeded or
// failed; and, for waits ended by a signal, the time to the start of the
// steps waiting on them (their edges by task_deps_depends_on_idx, the steps
// by primary key).
const FINISHED_SQL = `
WITH clock AS (SELECT coalesce($1::timestamptz, pg_catalog.now()) AS now_at),
recent AS (
  SELECT x.* FROM clock c
  CROSS JOIN pg_catalog.unnest($4::outlive.task_state[]) AS s(state)
  CROSS JOIN LATERAL (
    SELECT t.id, t.queue, t.state, t.name, t.run_at, t.started_at, t.finished_at, t.signal IS NOT NULL AS signalled FROM outlive.tasks t
    WHERE t.state OPERATOR(pg_catalog.=) s.state
      AND t.finished_at OPERATOR(pg_catalog.>) (c.now_at OPERATOR(pg_catalog.-) ($2::float8 OPERATOR(pg_catalog.*) interval '1 second'))
      AND t.finished_at OPERATOR(pg_catalog.<=) c.now_at
    ORDER BY t.finished_at DESC
    LIMIT $3
  ) x
)
SELECT 'count' AS kind, r.queue, r.state::text AS state, pg_catalog.count(*)::int AS n, NULL::float8[] AS a, NULL::float8[] AS b
FROM recent r GROUP BY r.queue, r.state
UNION ALL
SELECT 'durations', NULL, NULL, NULL,
       pg_catalog.percentile_cont($5::float8[]) WITHIN GROUP (ORDER BY extract(epoch FROM (r.finished_at OPERATOR(pg_catalog.-) r.started_at))::float8),
       pg_catalog.percentile_cont($5::float8[]) WITHIN GROUP (ORDER BY greatest(extract(epoch FROM (r.started_at OPERATOR(pg_catalog.-) r.run_at))::float8, 0))
FROM recent r
WHERE r.state OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'failed']::outlive.task_state[])
  AND r.name OPERATOR(pg_catalog.<>) $6 AND r.started_at IS NOT NULL
UNION ALL
SELECT 'resume', NULL, NULL, NULL,
       pg_catalog.percentile_cont($5::float8[]) WITHIN GROUP (ORDER BY extract(epoch FROM (n.started_at OPERATOR(pg_catalog.-) r.finished_at))::float8),
       NULL
FROM recent r
JOIN outlive.task_deps d ON d.depends_on OPERATOR(pg_catalog.=) r.id
JOIN outlive.tasks n ON n.id OPERATOR(pg_catalog.=) d.task_id
WHERE r.state OPERATOR(pg_catalog.=) 'succeeded' AND r.name OPERATOR(pg_catalog.=) $6 AND r.signalled
  AND n.started_at OPERATOR(pg_catalog.>=) r.finished_at`;

const PAUSES_SQL = `
SELECT (SELECT pg_catalog.count(*)::int FROM outlive.limits l
        WHERE l.paused_until OPERATOR(pg_catalog.>) coalesce($1::timestamptz, pg_catalog.now())) AS keys_paused,
       ARRAY(SELECT p.queue FROM outlive.queue_pauses p ORDER BY p.queue LIMIT 1000) AS queues,
       coalesce($1::timestamptz, pg_catalog.now()) AS now_at`;

/** The statements a snapshot sends, by what they read; the tests EXPLAIN each. */
export const METRICS_STATEMENTS = { depth: DEPTH_SQL, finished: FINISHED_SQL, pauses: PAUSES_SQL } as const;

/** The parameters {@link METRICS_STATEMENTS} take, in order, for these options. */
export function metricsParams(options: MetricsOptions = {}): Record<keyof typeof METRICS_STATEMENTS, unknown[]> {
  const now = options.now ?? null;
  return {
    depth: [now, WAIT_TASK],
    finished: [now, windowOf(options), capOf(options), [...FINISHED_STATES], [...QUANTILES], WAIT_TASK],
    pauses: [now],
  };
}

function windowOf(options: MetricsOptions): number {
  const w = options.windowSeconds ?? 300;
  if (!(Number.isFinite(w) && w > 0 && w <= 86_400)) throw new RangeError(`outlive: metrics windowSeconds must be above 0 and at most 86400, not ${w}`);
  return w;
}

function capOf(options: MetricsOptions): number {
  const cap = options.sampleCap ?? 10_000;
  if (!(Number.isInteger(cap) && cap >= 1 && cap <= 1_000_000)) throw new RangeError(`outlive: metrics sampleCap must be a whole number from 1 to 1000000, not ${cap}`);
  return cap;
}

function zeroes<S extends string>(states: readonly S[]): Record<S, number> {
  return Object.fromEntries(states.map((s) => [s, 0])) as Record<S, number>;
}

function quantiles(values: number[] | null): Quantiles {
  return Object.fromEntries(QUANTILES.map((q, i) => [q, values?.[i] ?? null])) as Quantiles;
}

interface DepthRow { queue: string; ready: number; scheduled: number; running: number; waiting: number; blocked: number; lag_seconds: number }
interface FinishedRow { kind: 'count' | 'durations' | 'resume'; queue: string | null; state: FinishedState | null; n: number | null; a: number[] | null; b: number[] | null }

/** Reads a {@link MetricsSnapshot} on `q`: three statements, each over live rows or the window's. */
export async function readMetrics(q: Executor, options: MetricsOptions = {}): Promise<MetricsSnapshot> {
  const params = metricsParams(options);
  const cap = capOf(options);
  // One after the other: the executor may be one connection in a transaction.
  const depth = await q.query<DepthRow>(DEPTH_SQL, params.depth);
  const finished = await q.query<FinishedRow>(FINISHED_SQL, params.finished);
  const [pauses] = await q.query<{ keys_paused: number; queues: string[]; now_at: Date }>(PAUSES_SQL, params.pauses);
  const queues = new Map<string, QueueMetrics>();
  const queue = (name: string): QueueMetrics => {
    let m = queues.get(name);
    if (!m) queues.set(name, (m = { queue: name, depth: zeroes(DEPTH_STATES), blockedOnLimits: 0, lagSeconds: 0, paused: false, finished: zeroes(FINISHED_STATES) }));
    return m;
  };
  for (const r of depth) {
    const m = queue(r.queue);
    m.depth = { ready: r.ready, scheduled: r.scheduled, running: r.running, waiting: r.waiting };
    m.blockedOnLimits = r.blocked;
    m.lagSeconds = Math.max(0, r.lag_seconds);
  }
  let attempt: number[] | null = null;
  let latency: number[] | null = null;
  let resume: number[] | null = null;
  const perState = zeroes(FINISHED_STATES);
  for (const r of finished) {
    if (r.kind === 'durations') {
      attempt = r.a;
      latency = r.b;
    } else if (r.kind === 'resume') {
      resume = r.a;
    } else {
      queue(r.queue!).finished[r.state!] = r.n ?? 0;
      perState[r.state!] += r.n ?? 0;
    }
  }
  for (const name of pauses!.queues) queue(name).paused = true;
  return {
    now: pauses!.now_at,
    queues: [...queues.values()].sort((a, b) => (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0)),
    keysPaused: pauses!.keys_paused,
    windowSeconds: windowOf(options),
    sampleCap: cap,
    sampled: FINISHED_STATES.some((s) => perState[s] >= cap),
    attemptSeconds: quantiles(attempt),
    startLatencySeconds: quantiles(latency),
    signalToResumeSeconds: quantiles(resume),
  };
}

/**
 * Reads a {@link MetricsSnapshot} from any {@link Database} (a pg or Neon
 * pool, drizzle), in one transaction whose plans may not read a table
 * whole: statistics taken while a backlog was queued (or none yet) could
 * otherwise price a sequential scan of the history below the live rows'
 * indexes.
 */
export function metricsSnapshot(db: Database, options: MetricsOptions = {}): Promise<MetricsSnapshot> {
  return inTransaction(toPool(db), async (q) => {
    await q.query(`SELECT pg_catalog.set_config('enable_seqscan', 'off', true), pg_catalog.set_config('jit', 'off', true)`);
    return readMetrics(q, options);
  });
}
