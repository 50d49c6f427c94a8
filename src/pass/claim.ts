/**
 * Claim: take ready tasks for one pass, so that no other pass can take them.
 */
import type { Executor } from '../db/executor.js';
import type { RowLimit } from '../model/limits.js';

/** A task row as a pass claimed it. */
export interface ClaimedTask {
  id: string;
  name: string;
  queue: string;
  input: unknown;
  /** This attempt's number (the claim counted it). */
  attempts: number;
  max_attempts: number;
  timeout_ms: number;
  run_id: string | null;
  /** Its fairness key ('' with limits only); null for a task without flow control. */
  fair_key: string | null;
  /** The limits it holds slots of while it runs (src/model/limits.ts); null for none. */
  limits: RowLimit[] | null;
  /** The enqueue's W3C trace context; null for none. */
  trace_context: string | null;
  /** Its step key in a run; null for a task on its own. */
  step: string | null;
  /** Time from due to claimed, in ms; null for a step (its due time, its release, is not kept). */
  start_latency_ms: number | null;
}

/** What one claim asks for. */
export interface ClaimRequest {
  /** The pass's lease owner, unique per pass. */
  owner: string;
  limit: number;
  /** Claim only tasks whose timeout fits in what is left of the pass. */
  maxTimeoutMs: number;
  /** Only these queues; null for all. */
  queues: readonly string[] | null;
  /**
   * Only tasks of these names: those the pass has handlers for. A task no
   * pass knows stays pending (a rolling deploy, two services on one queue)
   * rather than failing for want of a handler.
   */
  names: readonly string[];
  /** Extra lease time beyond the task's timeout, to settle in. */
  leaseGraceMs: number;
  /**
   * The longest lease a claim takes. A task whose timeout is longer gets this
   * much, and the pass running it extends it while it runs (its heartbeat),
   * so a task of a pass that died is recovered within one lease, not one timeout.
   */
  leaseMs: number;
  /** The time to claim at; null for the database's clock. */
  now: Date | null;
  /**
   * At most this many tasks with flow control (limits or fairness); omitted
   * for no cap. A pass asks for no more than it has handlers free: one
   * waiting in its buffer would hold its keys' slots, its rate start and its
   * fair turn without running.
   */
  governedLimit?: number;
}

// SKIP LOCKED lets ten passes run this at the same instant and each take
// different rows, none waiting on another. The SELECT sits in a CTE feeding
// the UPDATE so the LIMIT subquery runs once (inlined, the planner may
// re-evaluate it per row and claim more than asked). The SELECT reads only
// tasks_claim_idx, a partial index of pending rows with no unfinished
// dependencies, in the order of this ORDER BY. The names ($8) are those the
// pass has handlers for, checked on the heap row like the timeout: 20 names
// cost what one does, while ready rows of names no pass knows are read past
// by every claim (docs/benchmarks.md, "The claim of known task names").
//
// The UPDATE finds the locked rows by primary key, cheaper than by ctid
// here (docs/benchmarks.md, "What the Postgres CPU buys"). Should a
// concurrent update have replaced a row between this statement's snapshot
// and its lock, the UPDATE follows it to the version the CTE locked and
// checks the state again there, so the claim is a compare-and-set on its own
// terms, not only through the lock its CTE took.
export const CLAIM_SQL = `
WITH ready AS (
  SELECT id FROM outlive.tasks
  WHERE state OPERATOR(pg_catalog.=) 'pending' AND waiting_on OPERATOR(pg_catalog.=) 0 AND fair_key IS NULL
    AND run_at OPERATOR(pg_catalog.<=) coalesce($1::timestamptz, pg_catalog.now())
    AND timeout_ms OPERATOR(pg_catalog.<=) $2
    AND ($3::text[] IS NULL OR queue OPERATOR(pg_catalog.=) ANY ($3::text[]))
    AND name OPERATOR(pg_catalog.=) ANY ($8::text[])
    AND queue OPERATOR(pg_catalog.<>) ALL (ARRAY(SELECT p.queue FROM outlive.queue_pauses p))
  ORDER BY priority DESC NULLS LAST, run_at, id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
)
UPDATE outlive.tasks t
SET state = 'running',
    attempts = t.attempts OPERATOR(pg_catalog.+) 1,
    lease_owner = $5,
    lease_expires_at = coalesce($1::timestamptz, pg_catalog.now())
      OPERATOR(pg_catalog.+) ((least(t.timeout_ms, $7) OPERATOR(pg_catalog.+) $6) OPERATOR(pg_catalog.*) interval '1 millisecond'),
    started_at = coalesce($1::timestamptz, pg_catalog.now()),
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
FROM ready
WHERE t.id OPERATOR(pg_catalog.=) ready.id AND t.state OPERATOR(pg_catalog.=) 'pending'
RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text,
  t.trace_context, t.step,
  CASE WHEN t.run_id IS NULL THEN pg_catalog.date_part('epoch', coalesce($1::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.-) t.run_at) OPERATOR(pg_catalog.*) 1000 END`;

/**
 * What a pass sends to claim: a call of `outlive.claim_tasks` (migration
 * 0014), which claims tasks with flow control through
 * `outlive.claim_governed` and the others through `outlive.claim`, whose
 * body is CLAIM_SQL (as migration 0021 last defined it), as a named statement.
 *
 * Named, so a connection parses and plans it once; CLAIM_SQL itself is not
 * prepared, because Postgres may switch a prepared statement to a generic
 * plan made while the table was empty, a scan of all of outlive.tasks. The
 * function makes its plan generic from the first call with sequential scans
 * priced out, so it is the index plan on a table of any size
 * (test/claim.test.ts; the costs in docs/benchmarks.md, "What the Postgres
 * CPU buys").
 */
const CLAIM_CALL_SQL = 'SELECT * FROM outlive.claim_tasks($1, $2, $3, $4, $5, $6, $7, $8, $9)';

/** The claim function this code calls, as `to_regprocedure` names it. */
export const CLAIM_FUNCTION = 'outlive.claim_tasks(timestamptz, integer, text[], integer, text, integer, integer, text[], integer)';

/** The plain claim, whose body is CLAIM_SQL. */
export const PLAIN_CLAIM_FUNCTION = 'outlive.claim(timestamptz, integer, text[], integer, text, integer, integer, text[])';

/** Postgres's error code for a call of a function that does not exist. */
const UNDEFINED_FUNCTION = '42883';

/** Claims up to `limit` ready tasks in one statement, marking them running under `owner`'s lease. */
export async function claim(db: Executor, req: ClaimRequest): Promise<ClaimedTask[]> {
  if (req.limit <= 0) return [];
  try {
    return await db.query<ClaimedTask>(
      CLAIM_CALL_SQL,
      [req.now, Math.floor(req.maxTimeoutMs), req.queues, req.limit, req.owner, req.leaseGraceMs, req.leaseMs, req.names, req.governedLimit ?? null],
      'outlive_claim_tasks',
    );
  } catch (err) {
    // A database migrated before 0014 has no outlive.claim_tasks.
    if ((err as { code?: string }).code === UNDEFINED_FUNCTION) {
      throw Object.assign(new Error(`${(err as Error).message}: the outlive schema is older than this code; run migrate() to bring it up to date`, { cause: err }), {
        code: UNDEFINED_FUNCTION,
      });
    }
    throw err;
  }
}

// The soonest a key with waiting tasks wakes on its own clock (a rate's
// window or spacing, a pause's end), in ms from the database's now: what a
// slot given back does not announce. limits_wake_idx answers it in one probe.
const KEY_WAKE_SQL = `
SELECT (extract(epoch FROM pg_catalog.min(l.wake_at) OPERATOR(pg_catalog.-) pg_catalog.now()) OPERATOR(pg_catalog.*) 1000)::float8 AS ms
FROM outlive.limits l
WHERE l.wake_at OPERATOR(pg_catalog.>) pg_catalog.now() AND l.wake_at OPERATOR(pg_catalog.<) 'infinity'::timestamptz`;

/** Milliseconds until the soonest key wakes by time, or null when none will. */
export async function untilKeyWakes(db: Executor): Promise<number | null> {
  const [row] = await db.query<{ ms: number | null }>(KEY_WAKE_SQL, []);
  return row?.ms ?? null;
}
