/**
 * Settle: write the outcomes of finished attempts back to their rows.
 *
 * Every settle is a compare-and-set on state, lease owner and attempt. A pass
 * whose lease was lost (recovered after expiring, or its task cancelled)
 * matches no row, and its late result is dropped: it cannot overwrite what
 * happened since, even when the same pass has claimed the row again (the
 * attempt differs then).
 */
import { OutliveError, toError } from '../model/errors.js';
import type { Redact } from '../model/redact.js';
import { entry, type Outcome } from './execute.js';
import { MAX_SNOOZES } from '../model/task.js';
import { inTransaction, toExecutor, type Executor, type PoolLike } from '../db/executor.js';
import { lostPreparedStatement } from '../db/statements.js';
import { applyRunEffects, type RunRow } from './run-effects.js';
import type { PreparedStep } from '../model/step.js';

/** A row a settle changed. `released` rows are pending again, their attempt handed back. */
export interface SettledRow extends RunRow {
  state: 'pending' | 'succeeded' | 'failed' | 'released' | 'snoozed';
}

// One statement settles a whole batch, whatever mix of successes, retries and
// failures it holds: outcomes travel as parallel arrays and unnest into rows.
// Under load this folds the settles of every task that finished while the
// previous settle was in flight into one round trip and one commit. Outputs
// and errors are JSON text, cast row by row (see INSERT_TASKS in src/write/enqueue.ts).
// The planner may find the rows through tasks_lease_idx, which is keyed by
// lease owner first (migration 0008), so a settle reads its own pass's
// running rows there, never every pass's (test/settle.test.ts, "settle plans").
// The attempt is compared too: a pass whose lease expired may claim the
// same row again while its first attempt still runs, and only the attempt
// tells that attempt's late result from the current one. It is compared
// as `(... = ...) IS TRUE` (both sides are never null): written as a bare
// `=` it is a second join key, and a generic plan made without statistics
// joined the batch by rescanning the array for every running row of the
// pass. This way the rows are joined by id alone, as before, and filtered.
// (It was IS NOT DISTINCT FROM, whose `=` cannot be named with its schema;
// see "Names in SQL" in ARCHITECTURE.md.)
// The statements for tasks without flow control match no governed row: a
// governed row holds slots that only the governed statement gives back, so
// an outcome that reached the plain statement by mistake leaves its row
// running, for recovery to settle and give back, rather than leaking a slot.
const PLAIN_ROWS_ONLY = '\n  AND t.fair_key IS NULL';

// A snooze puts the task back without spending an attempt (max_attempts
// grows by one, so attempt numbers stay unique), while the row has snoozed
// fewer than MAX_SNOOZES times; the one after fails it with the outcome's
// error. SET reads the row as it was, so every column sees the same count.
const SNOOZE_FITS = `t.snoozes OPERATOR(pg_catalog.<) ${MAX_SNOOZES}`;
const SNOOZED = `(s.state OPERATOR(pg_catalog.=) 'snoozed' AND ${SNOOZE_FITS})`;

export const SETTLE_SQL = settleSql(false);

/**
 * SETTLE_SQL, or (governed) its form for tasks with flow control, which
 * also returns what the slot release needs, with each outcome's costs and
 * pause ($10). Either way a retry leaves its turn (vt), to be placed again
 * when due, and a wait for a key ends (both null on rows without flow control).
 */
function settleSql(governed: boolean): string {
  return `
UPDATE outlive.tasks t
SET state = (CASE WHEN s.state OPERATOR(pg_catalog.=) 'released' THEN 'pending'
                  WHEN s.state OPERATOR(pg_catalog.=) 'snoozed' THEN CASE WHEN ${SNOOZE_FITS} THEN 'pending' ELSE 'failed' END
                  ELSE s.state END)::outlive.task_state,
    output = CASE WHEN s.state OPERATOR(pg_catalog.=) 'succeeded' THEN s.output::jsonb ELSE t.output END,
    attempts = CASE WHEN s.state OPERATOR(pg_catalog.=) 'released' THEN greatest(t.attempts OPERATOR(pg_catalog.-) 1, 0) ELSE t.attempts END,
    max_attempts = CASE WHEN ${SNOOZED} THEN t.max_attempts OPERATOR(pg_catalog.+) 1 ELSE t.max_attempts END,
    snoozes = CASE WHEN ${SNOOZED} THEN t.snoozes OPERATOR(pg_catalog.+) 1 ELSE t.snoozes END,
    run_at = CASE WHEN s.state OPERATOR(pg_catalog.=) 'pending' OR ${SNOOZED}
                  THEN coalesce(s.retry_at, coalesce($1::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+) (s.delay_ms OPERATOR(pg_catalog.*) interval '1 millisecond'))
                  WHEN s.state OPERATOR(pg_catalog.=) 'released' THEN coalesce($1::timestamptz, pg_catalog.now())
                  ELSE t.run_at END,
    last_error = CASE WHEN ${SNOOZED} THEN t.last_error ELSE coalesce(s.error::jsonb OPERATOR(pg_catalog.->>) 'message', t.last_error) END,
    errors = CASE WHEN s.error IS NULL OR ${SNOOZED} THEN t.errors ELSE t.errors OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(s.error::jsonb) END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = CASE WHEN s.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'released']) OR ${SNOOZED} THEN NULL ELSE coalesce($1::timestamptz, pg_catalog.now()) END,
    vt = CASE WHEN s.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'snoozed']) THEN NULL ELSE t.vt END,
    blocked_on = NULL,
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::timestamptz[]),
                pg_catalog.unnest($6::float8[]), pg_catalog.unnest($7::text[]), pg_catalog.unnest($9::int[])${governed ? ', pg_catalog.unnest($10::text[])' : ''})
     AS s(id, state, output, retry_at, delay_ms, error, attempt${governed ? ', flow' : ''})
WHERE t.id OPERATOR(pg_catalog.=) s.id AND t.state OPERATOR(pg_catalog.=) 'running' AND t.lease_owner OPERATOR(pg_catalog.=) $8
  AND (t.attempts OPERATOR(pg_catalog.=) s.attempt) IS TRUE${governed ? '' : PLAIN_ROWS_ONLY}
RETURNING t.id::text, CASE WHEN s.state OPERATOR(pg_catalog.=) 'snoozed' AND t.state OPERATOR(pg_catalog.=) 'failed' THEN 'failed' ELSE s.state END AS state,
          t.run_id::text, t.step${governed ? ', t.limits, s.attempt, s.flow' : ''}`;
}

// The slots of the governed rows a settle changed, given back by the same
// statement (outlive.release_slots, migration 0014): a settle that matched
// nothing (a stale attempt, a lost lease) gives back nothing, and one that
// matched gives back exactly once.
const SLOTS_CTE = `
slots AS (
  SELECT outlive.release_slots(
           coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(s.limits, s.id, s.attempt, s.flow::jsonb)) FILTER (WHERE s.limits IS NOT NULL OR s.flow IS NOT NULL),
                    '[]'::jsonb),
           $1::timestamptz) AS n
  FROM settled s
)`;

/** A governed settle: the settle and its slots in one statement. */
const SETTLE_GOVERNED_SQL = `
WITH settled AS (${settleSql(true)}),${SLOTS_CTE}
SELECT s.id, s.state, s.run_id, s.step, (SELECT n FROM slots) AS slots FROM settled s`;

// The common case, a batch of successes, in a statement of its own: two
// arrays instead of six, and no CASE per column. Measured on claim and
// settle of 100,000 plain tasks in batches of 250 (2 cores, PostgreSQL 15):
// Postgres CPU 35-37 ms per 1,000 tasks with SETTLE_SQL for the successes,
// 29-33 ms with this.
export const SUCCEED_SQL = `
UPDATE outlive.tasks t
SET state = 'succeeded',
    output = s.output::jsonb,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = coalesce($1::timestamptz, pg_catalog.now()),
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($5::int[])) AS s(id, output, attempt)
WHERE t.id OPERATOR(pg_catalog.=) s.id AND t.state OPERATOR(pg_catalog.=) 'running' AND t.lease_owner OPERATOR(pg_catalog.=) $4
  AND (t.attempts OPERATOR(pg_catalog.=) s.attempt) IS TRUE${PLAIN_ROWS_ONLY}
RETURNING t.id::text, 'succeeded'::text AS state, t.run_id::text, t.step`;

// Successes of standalone tasks defined with keepSucceeded: false: the row
// goes, under the same compare-and-set as an UPDATE settle. Measured on
// claim-and-settle loops of 100,000 plain tasks in batches of 500 (2 cores,
// PostgreSQL 15): Postgres CPU of the settle 2.2 ms per 1,000 tasks this way
// against 8.3 for SUCCEED_SQL, which writes a third row version and two index
// entries to keep the row. (This needs outlive.task_deps to have no foreign
// key to outlive.tasks: see db/schema.ts.)
export const DROP_SQL = `
DELETE FROM outlive.tasks t
USING ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($3::int[])) AS s(id, attempt)
WHERE t.id OPERATOR(pg_catalog.=) s.id AND t.state OPERATOR(pg_catalog.=) 'running' AND t.lease_owner OPERATOR(pg_catalog.=) $2
  AND (t.attempts OPERATOR(pg_catalog.=) s.attempt) IS TRUE${PLAIN_ROWS_ONLY}
RETURNING t.id::text, 'succeeded'::text AS state, t.run_id::text, t.step`;

// Settles of run tasks that neither failed for good nor spawned anything
// (most of a run's settles) in one statement: the settle, the release of
// dependents and the runs' counts, where the general path takes a
// transaction of five round trips. Rows settled here are running and the
// dependents released are pending, so no row is touched by two of its parts.
// Measured on a 10,000-page fan-out in one pass (2 cores, PostgreSQL 15,
// a machine shared with other work): 567 tasks/s with the transaction per
// batch, 1,287 tasks/s this way.
const withRunEffects = (settleSql: string, slots = false) => `
WITH settled AS (${settleSql}),${slots ? SLOTS_CTE + ',' : ''}
released AS (
  UPDATE outlive.tasks d
  SET waiting_on = d.waiting_on OPERATOR(pg_catalog.-) c.n, updated_at = coalesce($1::timestamptz, pg_catalog.now())
  FROM (SELECT dep.task_id, pg_catalog.count(*)::int AS n
        FROM outlive.task_deps dep JOIN settled s ON s.id::bigint OPERATOR(pg_catalog.=) dep.depends_on
        WHERE s.state OPERATOR(pg_catalog.=) 'succeeded' GROUP BY dep.task_id) c
  WHERE d.id OPERATOR(pg_catalog.=) c.task_id AND d.state OPERATOR(pg_catalog.=) 'pending'
  RETURNING d.queue, d.waiting_on
),
finished AS (
  UPDATE outlive.runs r
  SET unfinished = r.unfinished OPERATOR(pg_catalog.-) c.n,
      state = CASE WHEN r.state OPERATOR(pg_catalog.=) 'running' AND (r.unfinished OPERATOR(pg_catalog.-) c.n) OPERATOR(pg_catalog.<=) 0
                   THEN CASE WHEN r.failed_task_id IS NULL THEN 'succeeded' ELSE 'failed' END::outlive.run_state
                   ELSE r.state END,
      finished_at = CASE WHEN r.state OPERATOR(pg_catalog.=) 'running' AND (r.unfinished OPERATOR(pg_catalog.-) c.n) OPERATOR(pg_catalog.<=) 0
                         THEN coalesce($1::timestamptz, pg_catalog.now()) ELSE r.finished_at END,
      updated_at = coalesce($1::timestamptz, pg_catalog.now())
  FROM (SELECT run_id::bigint AS run_id, pg_catalog.count(*)::int AS n FROM settled
        WHERE run_id IS NOT NULL AND state OPERATOR(pg_catalog.=) 'succeeded' GROUP BY 1) c
  WHERE r.id OPERATOR(pg_catalog.=) c.run_id
  RETURNING r.id
)
SELECT s.*, (SELECT pg_catalog.count(pg_catalog.pg_notify('outlive', q.queue))
             FROM (SELECT DISTINCT queue FROM released WHERE waiting_on OPERATOR(pg_catalog.=) 0) q) AS notified,
       (SELECT pg_catalog.count(*) FROM finished) AS runs${slots ? ', (SELECT n FROM slots) AS slots' : ''}
FROM settled s`;

export const SETTLE_RUN_TASKS_SQL = withRunEffects(SETTLE_SQL);
export const SUCCEED_RUN_TASKS_SQL = withRunEffects(SUCCEED_SQL);
const SETTLE_GOVERNED_RUN_TASKS_SQL = withRunEffects(settleSql(true), true);

/** The statements of one settle: the general one, and the one for a batch of successes. */
interface SettleStatements {
  any: { text: string; name: string };
  /** Null for governed rows: their successes go through `any`, which gives back their slots. */
  succeeded: { text: string; name: string } | null;
}

// A name goes with one text: renamed whenever the text changes (v3: names
// qualified with pg_catalog; v4: vt and blocked_on, and plain rows only; v5 and governed v2: snoozes), so a server connection that a transaction
// pooler shares with a pass of the previous release never runs one
// release's text under the other's name.
const PLAIN: SettleStatements = {
  any: { text: SETTLE_SQL, name: 'outlive_settle_v5' },
  succeeded: { text: SUCCEED_SQL, name: 'outlive_succeed_v4' },
};
const RUN_TASKS: SettleStatements = {
  any: { text: SETTLE_RUN_TASKS_SQL, name: 'outlive_settle_runs_v5' },
  succeeded: { text: SUCCEED_RUN_TASKS_SQL, name: 'outlive_succeed_runs_v4' },
};
const GOVERNED: SettleStatements = { any: { text: SETTLE_GOVERNED_SQL, name: 'outlive_settle_governed_v2' }, succeeded: null };
const GOVERNED_RUN_TASKS: SettleStatements = { any: { text: SETTLE_GOVERNED_RUN_TASKS_SQL, name: 'outlive_settle_governed_runs_v2' }, succeeded: null };

function settleRows(db: Executor, owner: string, outcomes: readonly Outcome[], now: Date | null, statements = PLAIN): Promise<SettledRow[]> {
  const ids: string[] = new Array(outcomes.length);
  const attempts: number[] = new Array(outcomes.length);
  const governed = statements.succeeded === null;
  if (!governed && outcomes.every((o) => o.state === 'succeeded')) {
    const outputs: (string | null)[] = new Array(outcomes.length);
    for (let i = 0; i < outcomes.length; i++) {
      const o = outcomes[i] as Extract<Outcome, { state: 'succeeded' }>;
      ids[i] = o.id;
      attempts[i] = o.attempt;
      outputs[i] = o.output;
    }
    const { text, name } = statements.succeeded!;
    return db.query<SettledRow>(text, [now, ids, outputs, owner, attempts], name);
  }
  const states: string[] = [];
  const outputs: (string | null)[] = [];
  const retryAts: (Date | null)[] = [];
  const delays: number[] = [];
  const errors: (string | null)[] = [];
  for (let i = 0; i < outcomes.length; i++) {
    const o = outcomes[i]!;
    ids[i] = o.id;
    attempts[i] = o.attempt;
    states.push(o.state);
    outputs.push(o.state === 'succeeded' ? o.output : null);
    retryAts.push(o.state === 'pending' || o.state === 'snoozed' ? o.retryAt : null);
    delays.push(o.state === 'pending' || o.state === 'snoozed' ? o.delayMs : 0);
    errors.push(o.state === 'pending' || o.state === 'failed' || o.state === 'snoozed' ? JSON.stringify(o.error) : null);
  }
  const { text, name } = statements.any;
  const values = [now, ids, states, outputs, retryAts, delays, errors, owner, attempts];
  if (governed) values.push(outcomes.map((o) => o.flow ?? null));
  return db.query<SettledRow>(text, values, name);
}

/** Settles and applies run knock-ons in one transaction. */
function settleWithRuns(pool: PoolLike, owner: string, outcomes: readonly Outcome[], now: Date | null): Promise<SettledRow[]> {
  return inTransaction(pool, async (db) => {
    const rows = strip(await settleRows(db, owner, outcomes, now, outcomes.some(holdsSlots) ? GOVERNED : PLAIN));
    const spawns = new Map<string, PreparedStep[]>();
    for (const o of outcomes) if (o.state === 'succeeded' && o.spawns) spawns.set(o.id, o.spawns);
    await applyRunEffects(db, rows, spawns, now);
    return rows;
  });
}

/**
 * Settles a batch of outcomes held under `owner`'s lease; returns the rows it
 * changed. Tasks outside runs, and run tasks that neither failed nor spawned,
 * settle in one statement; the others in one transaction with their run
 * knock-ons. If the batch fails (a spawn naming a step that exists, a value
 * the database refuses, a deadlock between settles of one run), each outcome
 * is retried alone, and one the database still refuses is settled as a
 * failure carrying its error, so one bad outcome never keeps the others from
 * landing. A deadlock or serialization failure says nothing about the
 * outcome: it is tried again, and one that never lands keeps its lease (for
 * recovery) and fails the call once the others have landed, as
 * {@link SettleIncompleteError}.
 */
export async function settle(pool: PoolLike, owner: string, given: readonly Outcome[], now: Date | null, redact?: Redact): Promise<SettledRow[]> {
  if (given.length === 0) return [];
  const outcomes = redact ? given.map((o) => redacted(o, redact)) : given;
  try {
    return await settleBatch(pool, owner, outcomes, now);
  } catch (err) {
    // A lost connection fails every outcome alike: the rows keep their leases.
    if (!refusedByDatabase(err) && !transient(err)) throw err;
    const rows: SettledRow[] = [];
    let unlanded: unknown = null;
    let kept = 0;
    for (const [i, outcome] of outcomes.entries()) {
      let lastError: unknown;
      let done = false;
      // Refused twice, it is refused; a lock meeting may take a few tries.
      for (let attempt = 0, refusals = 0; !done && refusals < 2 && attempt < TRANSIENT_TRIES; attempt++) {
        try {
          rows.push(...(await settleBatch(pool, owner, [outcome], now)));
          done = true;
        } catch (err) {
          lastError = err;
          if (transient(err)) await new Promise((r) => setTimeout(r, 5 * 2 ** attempt));
          else if (refusedByDatabase(err)) refusals++;
          else throw new SettleIncompleteError(err, rows, kept + outcomes.length - i);
        }
      }
      if (done) continue;
      if (transient(lastError)) {
        unlanded ??= lastError;
        kept++;
        continue;
      }
      const err = toError(lastError);
      const failed: Outcome = redacted({
        id: outcome.id,
        runId: outcome.runId,
        attempt: outcome.attempt,
        ...(outcome.governed ? { governed: true as const } : {}),
        state: 'failed',
        error: entry(new Error(`could not record the outcome: ${err.message}`, { cause: err }), 0),
      }, redact);
      rows.push(...(await settleBatch(pool, owner, [failed], now)));
    }
    if (unlanded) throw new SettleIncompleteError(unlanded, rows, kept);
    return rows;
  }
}

/**
 * The outcome with the deployment's secrets blanked out of what its row will
 * keep: the error's message and stack, and a rate limit's pause reason.
 */
function redacted(o: Outcome, redact: Redact | undefined): Outcome {
  if (!redact) return o;
  let out = o;
  if ('error' in o) {
    const { message, stack } = o.error;
    const error = { ...o.error, message: redact(message) };
    if (stack !== undefined) error.stack = redact(stack);
    out = { ...o, error };
  }
  // The flow report is JSON: its strings are redacted before they are escaped, as the log's are.
  if (typeof o.flow === 'string' && o.flow.includes('"pause"')) {
    out = { ...out, flow: JSON.stringify(JSON.parse(o.flow), (_key, value: unknown) => (typeof value === 'string' ? redact(value) : value)) };
  }
  return out;
}

/** How often one outcome is tried when the database keeps choosing it as a deadlock's victim. */
const TRANSIENT_TRIES = 6;

/**
 * A settle that wrote some outcomes and not others (the connection failed,
 * or a lock meeting never cleared): `rows` are the ones that landed, and
 * `kept` outcomes were not written, their rows keeping their leases.
 */
export class SettleIncompleteError extends OutliveError {
  constructor(
    cause: unknown,
    readonly rows: SettledRow[],
    readonly kept: number,
  ) {
    super(toError(cause).message, { cause });
  }
}

/** Deadlock and serialization failure: the same write may land when tried again. */
function transient(err: unknown): boolean {
  const code = (err as { code?: unknown })?.code;
  return code === '40P01' || code === '40001';
}

/** Settles one batch: one statement where it can, else a transaction with the run knock-ons. */
async function settleBatch(pool: PoolLike, owner: string, outcomes: readonly Outcome[], now: Date | null): Promise<SettledRow[]> {
  // A batch with any task that holds slots settles through the governed
  // statement, plain tasks and all: one statement, so nothing is half written.
  const governed = outcomes.some(holdsSlots);
  if (governed && outcomes.every((o) => o.runId === null)) return strip(await settleRows(toExecutor(pool), owner, outcomes, now, GOVERNED));
  if (outcomes.every((o) => o.runId === null)) {
    const dropped: string[] = [];
    const droppedAttempts: number[] = [];
    const kept: Outcome[] = [];
    for (const o of outcomes) {
      if (o.state === 'succeeded' && o.drop) {
        dropped.push(o.id);
        droppedAttempts.push(o.attempt);
      } else kept.push(o);
    }
    if (dropped.length === 0) return settleRows(toExecutor(pool), owner, outcomes, now);
    const drop = (db: Executor) => db.query<SettledRow>(DROP_SQL, [dropped, owner, droppedAttempts], 'outlive_drop_v4');
    if (kept.length === 0) return drop(toExecutor(pool));
    // Both kinds in one batch: one transaction, so that a batch the database
    // refuses is retried outcome by outcome with nothing half written.
    return inTransaction(pool, async (db) => (await drop(db)).concat(await settleRows(db, owner, kept, now)));
  }
  // A snooze may turn out a failure (one too many), so it takes the path that applies a failure's run effects.
  if (outcomes.every((o) => o.state !== 'failed' && o.state !== 'snoozed' && !(o.state === 'succeeded' && o.spawns?.length))) {
    try {
      return strip(await settleRows(toExecutor(pool), owner, outcomes, now, governed ? GOVERNED_RUN_TASKS : RUN_TASKS));
    } catch {
      // A deadlock between settles of one run, say: the transaction below.
    }
  }
  return settleWithRuns(pool, owner, outcomes, now);
}

/** An outcome whose settle has slots to give back or a pause to apply. */
function holdsSlots(o: Outcome): boolean {
  return o.governed === true || (o.flow ?? null) !== null;
}

/**
 * True for an error about what was written (a check of ours, or an error the
 * database raised about the statement), not about the connection (SQLSTATE
 * classes 08 and 57, no SQLSTATE at all, a prepared statement the path did
 * not keep) nor a passing lock meeting.
 */
function refusedByDatabase(err: unknown): boolean {
  if (err instanceof OutliveError) return true;
  // A prepared statement the connection path lost says nothing about the outcome.
  if (lostPreparedStatement(err)) return false;
  const code = (err as { code?: unknown })?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && !code.startsWith('08') && !code.startsWith('57') && !transient(err);
}

function strip(rows: (SettledRow & { notified?: unknown; runs?: unknown })[]): SettledRow[] {
  return rows.map(({ id, state, run_id, step }) => ({ id, state, run_id, step }));
}
