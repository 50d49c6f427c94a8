/**
 * The end-of-run checks, read from the rows and from the side-effect table
 * alone. Each returns the violations it found (empty: the guarantee held),
 * with up to a few example rows each, so a failure says what went wrong.
 */
import type pg from 'pg';
import type { SendRecord, WaitLog } from './waits.js';

/** What the orchestrator knows it wrote: every enqueue and run whose commit it saw. */
export interface Expected {
  /** `n` of every plain task whose enqueue committed. */
  plain: Set<number>;
  /** `n` of every plain task whose enqueue failed (it may or may not exist: the commit's answer may be what was lost). */
  plainUncertain: Set<number>;
  /** Names of runs whose start committed, and those whose start failed. */
  runs: Set<string>;
  runsUncertain: Set<string>;
  /** The waiting runs and what the signaller sent for each. */
  waits?: WaitLog[];
}

/** What the waits' checks counted (issue 27). */
export interface WaitReport {
  /** Runs waiting for a signal, and runs sleeping. */
  waitRuns: number;
  sleepRuns: number;
  /** Distinct signal ids, and the sends of them (copies included). */
  signalIds: number;
  sends: number;
  /** Copies planned beyond the first of an id, and answers that said "duplicate". */
  duplicateCopies: number;
  answeredDuplicate: number;
  /** Tries whose answer a fault lost (each sent again under its id), and ids whose only write was such a try. */
  lostAnswers: number;
  committedUnseen: number;
  /** First answers for an id: kept before its run was started, kept while its wait had not begun, delivered to a parked wait. */
  keptBeforeRun: number;
  keptBeforeWait: number;
  deliveredToParked: number;
  /** Second ids whose wait had already taken another: kept, unconsumed, as they should be. */
  extraKept: number;
  reordered: number;
  racing: number;
  /** Waits the signaller saw parked before it sent. */
  sawParked: number;
  /** Steps after a wait executed more than once (faults: kills, backdated leases), every execution with the same output. */
  recordReExecuted: number;
}

/** What the checks counted. */
export interface CheckReport {
  violations: string[];
  tasks: number;
  byState: Record<string, number>;
  runs: number;
  runsByState: Record<string, number>;
  effects: number;
  /** Tasks that executed (reached their side effect) more than once. */
  reExecutedTasks: number;
  /** Executions beyond one per task. */
  extraExecutions: number;
  /** Executions whose result was not the one recorded (abandoned at timeout, lease lost, killed after the effect). */
  discardedExecutions: number;
  scheduledSlots: number;
  /** Tasks whose handler never fails that still failed for good (their attempts used up by kills, hangs and cuts). */
  exhaustedByFaults: number;
  /** Samples of the limit keys' counts taken during the run (the harness's). */
  keySamples?: number;
  waits?: WaitReport;
}

async function q<R>(pool: pg.Pool, text: string, params: unknown[] = []): Promise<R[]> {
  return (await pool.query(text, params)).rows as R[];
}

/** Runs every check against the database of `pool`, as of the database time `now`. */
export async function checkAll(pool: pg.Pool, expected: Expected, now: Date): Promise<CheckReport> {
  const violations: string[] = [];
  const fail = (what: string, rows: unknown[]) => {
    if (rows.length > 0) violations.push(`${what}: ${rows.length} (e.g. ${JSON.stringify(rows.slice(0, 3))})`);
  };

  const byState = Object.fromEntries(
    (await q<{ state: string; n: number }>(pool, `SELECT state::text, count(*)::int AS n FROM outlive.tasks GROUP BY 1`)).map((r) => [r.state, r.n]),
  );
  const tasks = Object.values(byState).reduce((a, b) => a + b, 0);

  // 1. Every task final, or pending for a reason: its time has not come, or it waits on unfinished steps.
  fail('tasks left running after the final recovery', await q(pool, `SELECT id, name, attempts, lease_expires_at FROM outlive.tasks WHERE state = 'running'`));
  fail(
    'tasks pending with nothing to wait for',
    await q(pool, `SELECT id, name, run_at, waiting_on FROM outlive.tasks WHERE state = 'pending' AND waiting_on = 0 AND run_at <= $1`, [now]),
  );

  // 2. Attempts never exceed the maximum.
  fail('tasks with more attempts than max_attempts', await q(pool, `SELECT id, attempts, max_attempts FROM outlive.tasks WHERE attempts > max_attempts`));

  // 3. Exactly-once settlement: a succeeded task's output names one execution,
  //    the one of its last counted attempt, and that execution's effect exists once.
  fail(
    'succeeded tasks whose output matches no single execution of their last attempt',
    await q(
      pool,
      `SELECT t.id, t.attempts, t.output FROM outlive.tasks t
       WHERE t.state = 'succeeded' AND t.name LIKE 'chaos.%'
         AND ((t.output->>'attempt')::int IS DISTINCT FROM t.attempts
              OR (SELECT count(*) FROM chaos_effects e WHERE e.task_id = t.id AND e.token::text = t.output->>'token' AND e.attempt = t.attempts) <> 1)`,
    ),
  );

  // 4. At-least-once, bounded: one execution per counted attempt at most, and no
  //    attempt number ever ran twice (two executions of one claim).
  fail(
    'attempts that executed twice',
    await q(pool, `SELECT task_id, attempt, count(*)::int AS n FROM chaos_effects GROUP BY 1, 2 HAVING count(*) > 1`),
  );
  fail(
    'executions beyond the attempts counted',
    await q(
      pool,
      `SELECT e.task_id, max(e.attempt) AS max_attempt, count(*)::int AS n, t.attempts FROM chaos_effects e JOIN outlive.tasks t ON t.id = e.task_id
       GROUP BY e.task_id, t.attempts HAVING max(e.attempt) > t.attempts OR count(*) > t.attempts`,
    ),
  );
  fail('effects of tasks that do not exist', await q(pool, `SELECT DISTINCT e.task_id FROM chaos_effects e LEFT JOIN outlive.tasks t ON t.id = e.task_id WHERE t.id IS NULL LIMIT 10`));

  // 5. Nothing lost, nothing doubled: every committed enqueue and run is there, once.
  const plainRows = await q<{ n: number; c: number }>(
    pool,
    `SELECT (input->>'n')::int AS n, count(*)::int AS c FROM outlive.tasks WHERE name = 'chaos.plain' AND run_id IS NULL GROUP BY 1`,
  );
  const seen = new Map(plainRows.map((r) => [r.n, r.c]));
  fail('plain tasks enqueued twice', plainRows.filter((r) => r.c > 1));
  fail('committed plain tasks missing', [...expected.plain].filter((n) => !seen.has(n)));
  fail('plain tasks nobody enqueued', plainRows.filter((r) => !expected.plain.has(r.n) && !expected.plainUncertain.has(r.n)));
  const runRows = await q<{ name: string; c: number }>(pool, `SELECT name, count(*)::int AS c FROM outlive.runs GROUP BY 1`);
  const runSeen = new Map(runRows.map((r) => [r.name, r.c]));
  fail('runs started twice', runRows.filter((r) => r.c > 1));
  fail('committed runs missing', [...expected.runs].filter((n) => !runSeen.has(n)));

  // 6. Every run's state matches its tasks.
  const runStates = await q<{ id: string; state: string; unfinished: number; open: number; total: number; ok: number; failed: number; failed_task_state: string | null }>(
    pool,
    `SELECT r.id, r.state::text, r.unfinished,
            count(t.id) FILTER (WHERE t.state IN ('pending', 'running'))::int AS open,
            count(t.id)::int AS total,
            count(t.id) FILTER (WHERE t.state = 'succeeded')::int AS ok,
            count(t.id) FILTER (WHERE t.state = 'failed')::int AS failed,
            (SELECT f.state::text FROM outlive.tasks f WHERE f.id = r.failed_task_id) AS failed_task_state
     FROM outlive.runs r LEFT JOIN outlive.tasks t ON t.run_id = r.id GROUP BY r.id`,
  );
  fail('runs whose unfinished count is not their open tasks', runStates.filter((r) => r.unfinished !== r.open));
  fail('succeeded runs with a task not succeeded', runStates.filter((r) => r.state === 'succeeded' && r.ok !== r.total));
  fail('runs whose tasks all succeeded but are not succeeded', runStates.filter((r) => r.total > 0 && r.ok === r.total && r.state !== 'succeeded'));
  fail('failed runs without a failed task, or with tasks open', runStates.filter((r) => r.state === 'failed' && (r.failed === 0 || r.open > 0 || r.failed_task_state !== 'failed')));
  fail('running runs with nothing open', runStates.filter((r) => r.state === 'running' && r.open === 0));
  fail('runs with a failed task that did not fail', runStates.filter((r) => r.failed > 0 && r.open === 0 && r.state !== 'failed'));
  // A fan-out that succeeded wrote its spawns exactly once.
  fail(
    'succeeded fan-outs whose run does not hold children + join + root + side + tail',
    await q(
      pool,
      `SELECT f.run_id, jsonb_array_length(f.input->'children') + 4 AS want, (SELECT count(*)::int FROM outlive.tasks t WHERE t.run_id = f.run_id) AS got
       FROM outlive.tasks f WHERE f.name = 'chaos.fan' AND f.state = 'succeeded'
         AND (SELECT count(*) FROM outlive.tasks t WHERE t.run_id = f.run_id) <> jsonb_array_length(f.input->'children') + 4`,
    ),
  );
  // The tail, spawned to wait for the fan-out, the side step and a child,
  // ran only after all three succeeded, and counts exactly its unfinished
  // dependencies while it waits (none negative, no success counted twice).
  // Judged by the side effects' clock_timestamp(): a claim's started_at is its
  // transaction's now(), which may precede a settle that committed before the
  // claim function's own snapshot was taken.
  fail(
    'tails that ran before the steps they wait for had succeeded',
    await q(
      pool,
      `SELECT t.run_id, e.attempt, p.step, p.state::text FROM chaos_effects e
       JOIN outlive.tasks t ON t.id = e.task_id AND t.step = 'tail'
       JOIN outlive.task_deps d ON d.task_id = t.id JOIN outlive.tasks p ON p.id = d.depends_on
       LEFT JOIN chaos_effects pe ON pe.task_id = p.id AND pe.token::text = p.output->>'token'
       WHERE p.state <> 'succeeded' OR pe.at IS NULL OR pe.at > e.at`,
    ),
  );
  fail(
    'pending tasks whose count of unfinished dependencies is off',
    await q(
      pool,
      `SELECT t.id, t.step, t.waiting_on, (SELECT count(*)::int FROM outlive.task_deps d JOIN outlive.tasks p ON p.id = d.depends_on
                                           WHERE d.task_id = t.id AND p.state <> 'succeeded') AS unfinished
       FROM outlive.tasks t WHERE t.state = 'pending' AND t.run_id IS NOT NULL
         AND t.waiting_on <> (SELECT count(*) FROM outlive.task_deps d JOIN outlive.tasks p ON p.id = d.depends_on
                              WHERE d.task_id = t.id AND p.state <> 'succeeded')`,
    ),
  );

  // 7. Every scheduled slot enqueued once, and none skipped between the first and the last.
  const slots = await q<{ slot: string; c: number }>(
    pool,
    `SELECT input->>'slot' AS slot, count(*)::int AS c FROM outlive.tasks WHERE name = 'chaos.sched' GROUP BY 1 ORDER BY 1`,
  );
  fail('schedule slots enqueued more than once', slots.filter((s) => s.c > 1));
  const slotRows = await q<{ n: number; orphans: number }>(
    pool,
    `SELECT count(*)::int AS n, count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM outlive.tasks t WHERE t.id = s.task_id))::int AS orphans FROM outlive.schedule_slots s`,
  );
  if (slotRows[0]!.n !== slots.length) violations.push(`schedule_slots holds ${slotRows[0]!.n} rows for ${slots.length} slot tasks`);
  fail('schedule_slots rows whose task does not exist', slotRows[0]!.orphans > 0 ? [slotRows[0]] : []);
  const gaps: string[] = [];
  for (let i = 1; i < slots.length; i++) {
    const gap = Date.parse(slots[i]!.slot) - Date.parse(slots[i - 1]!.slot);
    if (gap !== 1000) gaps.push(`${slots[i - 1]!.slot} -> ${slots[i]!.slot}`);
  }
  fail('gaps between consecutive schedule slots', gaps);

  // Counts for the summary.
  const effects = (await q<{ n: number }>(pool, `SELECT count(*)::int AS n FROM chaos_effects`))[0]!.n;
  const multi = (
    await q<{ tasks: number; extra: number }>(
      pool,
      `SELECT count(*) FILTER (WHERE n > 1)::int AS tasks, coalesce(sum(n - 1), 0)::int AS extra FROM (SELECT task_id, count(*) AS n FROM chaos_effects GROUP BY 1) x`,
    )
  )[0]!;
  const discarded = (
    await q<{ n: number }>(
      pool,
      `SELECT count(*)::int AS n FROM chaos_effects e JOIN outlive.tasks t ON t.id = e.task_id
       WHERE t.state <> 'succeeded' OR e.token::text IS DISTINCT FROM t.output->>'token'`,
    )
  )[0]!.n;
  const exhausted = (
    // The steps of waiting runs never fail on their own either (no wait can reach its timeout in a chaos run).
    await q<{ n: number }>(
      pool,
      `SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'failed' AND ((name = 'chaos.plain' AND input->>'mode' <> 'fail') OR name IN ('chaos.record', '$wait'))`,
    )
  )[0]!.n;
  // Faults are the pass's, not the handler's: they count against the interruption budget, never maxAttempts.
  if (exhausted > 0) violations.push(`tasks whose handler never fails, failed for good by faults alone: ${exhausted}`);
  const waits = expected.waits ? await checkWaits(pool, expected.waits, fail) : undefined;
  const runsByState = Object.fromEntries(
    (await q<{ state: string; n: number }>(pool, `SELECT state::text, count(*)::int AS n FROM outlive.runs GROUP BY 1`)).map((r) => [r.state, r.n]),
  );
  return {
    violations,
    tasks,
    byState,
    runs: runStates.length,
    runsByState,
    effects,
    reExecutedTasks: multi.tasks,
    extraExecutions: multi.extra,
    discardedExecutions: discarded,
    scheduledSlots: slots.length,
    exhaustedByFaults: exhausted,
    waits,
  };
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * The waits (issue 27): every waiting run succeeded, each wait with the
 * payload of the first signal id sent for its key (any of them when two
 * raced), taken from one signal row, its next step run for that one resume
 * only; no wait timed out, none left parked once its signals were all sent,
 * and no signal id written twice or lost.
 */
async function checkWaits(pool: pg.Pool, logs: WaitLog[], fail: (what: string, rows: unknown[]) => void): Promise<WaitReport> {
  type Row = {
    name: string;
    run_state: string;
    wait_state: string | null;
    wait_output: unknown;
    wait_signal: { id: string; payload: unknown } | null;
    wait_key: string | null;
    last_error: string | null;
    records: number;
    record_state: string | null;
    record_output: { seen?: unknown } | null;
    record_attempts: number | null;
    record_effects: { attempt: number; seen: unknown }[];
  };
  const rows = await q<Row>(
    pool,
    `SELECT r.name, r.state::text AS run_state, w.state::text AS wait_state, w.output AS wait_output, w.signal AS wait_signal, w.wait_key, w.last_error,
            (SELECT count(*)::int FROM outlive.tasks x WHERE x.run_id = r.id AND x.step = 'record') AS records,
            rec.state::text AS record_state, rec.output AS record_output, rec.attempts AS record_attempts,
            (SELECT coalesce(jsonb_agg(jsonb_build_object('attempt', e.attempt, 'seen', e.detail -> 'seen') ORDER BY e.at), '[]'::jsonb)
             FROM chaos_effects e WHERE e.task_id = rec.id) AS record_effects
     FROM outlive.runs r
     LEFT JOIN outlive.tasks w ON w.run_id = r.id AND w.step IN ('w', 'nap')
     LEFT JOIN outlive.tasks rec ON rec.run_id = r.id AND rec.step = 'record'
     WHERE r.name = ANY($1::text[])`,
    [logs.map((l) => l.plan.run)],
  );
  const byRun = new Map(rows.map((r) => [r.name, r]));
  const signals = await q<{ key: string; id: string; payload: unknown; consumed: boolean; delivered: number }>(
    pool,
    `SELECT key, id, payload, consumed_at IS NOT NULL AS consumed, delivered FROM outlive.signals WHERE key LIKE 'chaos:%'`,
  );
  const byKey = new Map<string, typeof signals>();
  for (const s of signals) byKey.set(s.key, [...(byKey.get(s.key) ?? []), s]);

  const report: WaitReport = {
    waitRuns: 0, sleepRuns: 0, signalIds: 0, sends: 0, duplicateCopies: 0, answeredDuplicate: 0, lostAnswers: 0, committedUnseen: 0,
    keptBeforeRun: 0, keptBeforeWait: 0, deliveredToParked: 0, extraKept: 0, reordered: 0, racing: 0, sawParked: 0, recordReExecuted: 0,
  };
  const notSucceeded: unknown[] = [];
  const timedOut: unknown[] = [];
  const lost: unknown[] = [];
  const foreignOutput: unknown[] = [];
  const notFirst: unknown[] = [];
  const rowMismatch: unknown[] = [];
  const resumedTwice: unknown[] = [];
  const writtenTwice: unknown[] = [];
  const missing: unknown[] = [];
  const unsent: unknown[] = [];
  const downstream: unknown[] = [];
  const sleeps: unknown[] = [];
  const missingRuns: unknown[] = [];

  for (const log of logs) {
    const { plan } = log;
    const row = byRun.get(plan.run);
    if (plan.kind === 'sleep') report.sleepRuns++;
    else report.waitRuns++;
    if (plan.reordered) report.reordered++;
    if (plan.racing) report.racing++;
    if (log.sawParked) report.sawParked++;

    // What was sent, id by id, from the signaller's answers.
    const ids = new Map<string, { payload: unknown; answered: boolean; fresh: number; first?: SendRecord }>();
    for (const s of log.sends) {
      report.sends++;
      report.lostAnswers += s.lost;
      const e = ids.get(s.id) ?? { payload: s.payload, answered: false, fresh: 0 };
      ids.set(s.id, e);
      if (!s.result) {
        unsent.push({ run: plan.run, id: s.id, lost: s.lost });
        continue;
      }
      e.answered = true;
      if (s.result.duplicate) report.answeredDuplicate++;
      else {
        e.fresh++;
        e.first = s;
      }
    }
    for (const s of plan.signals) report.duplicateCopies += s.copies - 1;
    report.signalIds += ids.size;
    const kept = plan.key ? (byKey.get(plan.key) ?? []) : [];
    for (const [id, e] of ids) {
      // One id is one row: answered "new" at most once, stored with the payload sent.
      if (e.fresh > 1) writtenTwice.push({ run: plan.run, id, fresh: e.fresh });
      const stored = kept.find((s) => s.id === id);
      if (e.answered && (!stored || !same(stored.payload, e.payload))) missing.push({ run: plan.run, id, stored: stored ?? null });
      if (e.answered && e.fresh === 0) report.committedUnseen++;
    }

    if (!row) {
      if (log.started === true) missingRuns.push(plan.run);
      continue;
    }
    if (row.run_state !== 'succeeded') notSucceeded.push({ run: plan.run, run_state: row.run_state, wait_state: row.wait_state, wait_key: row.wait_key, last_error: row.last_error });
    if (row.wait_state === 'failed' && /^no signal /.test(row.last_error ?? '')) timedOut.push({ run: plan.run, last_error: row.last_error });

    // The step after the wait: one row, run for one resume, every execution reading the wait's output.
    const effects = row.record_effects;
    if (effects.length > 1) report.recordReExecuted++;
    if (
      row.wait_state === 'succeeded' &&
      (row.records !== 1 || row.record_state !== 'succeeded' || effects.length === 0 || !same(row.record_output?.seen, row.wait_output) ||
        effects.some((e) => !same(e.seen, row.wait_output)))
    ) {
      downstream.push({ run: plan.run, records: row.records, record_state: row.record_state, wait_output: row.wait_output, seen: effects.map((e) => e.seen), attempts: row.record_attempts });
    }

    if (plan.kind === 'sleep') {
      if (row.wait_state === 'succeeded' && row.wait_output !== null) sleeps.push({ run: plan.run, output: row.wait_output });
      continue;
    }

    const allSent = plan.signals.every((s) => ids.get(s.id)?.answered);
    if (row.wait_state === 'pending' && row.wait_key !== null && allSent) {
      lost.push({ run: plan.run, wait_key: row.wait_key, signal: row.wait_signal, signals: kept });
    }
    const consumed = kept.filter((s) => s.consumed);
    const delivered = kept.reduce((n, s) => n + s.delivered, 0);
    if (consumed.length > 1 || delivered > 1) resumedTwice.push({ run: plan.run, signals: kept });
    if (row.wait_state !== 'succeeded') continue;
    if (!plan.signals.some((s) => same(s.payload, row.wait_output))) foreignOutput.push({ run: plan.run, output: row.wait_output, sent: plan.signals.map((s) => s.payload) });
    // Sent one after another, each confirmed before the next: the first id committed first, so it is the one taken.
    const first = plan.signals[0]!;
    if (!plan.racing && !same(row.wait_output, first.payload)) notFirst.push({ run: plan.run, output: row.wait_output, first: first.payload, signals: kept });
    const taken = consumed[0];
    if (consumed.length !== 1 || row.wait_signal?.id !== taken?.id || !same(row.wait_signal?.payload, row.wait_output)) {
      rowMismatch.push({ run: plan.run, signal: row.wait_signal, output: row.wait_output, consumed });
    }

    // How each id's first "new" answer found its wait.
    for (const [id, e] of ids) {
      if (!e.first) continue;
      if (e.first.result!.delivered > 0) report.deliveredToParked++;
      else if (id !== taken?.id) report.extraKept++;
      else if (e.first.beforeRun) report.keptBeforeRun++;
      else report.keptBeforeWait++;
    }
  }

  fail('committed wait runs missing', missingRuns);
  fail('waiting runs that did not succeed', notSucceeded);
  fail('waits failed by their timeout', timedOut);
  fail('waits still parked after every signal for them was sent (a signal lost)', lost);
  fail('waits whose output is none of the payloads sent for their key', foreignOutput);
  fail('waits that did not take the first signal sent for their key', notFirst);
  fail('waits whose row names a signal other than the one signal consumed', rowMismatch);
  fail('keys whose signals resumed more than once (a wait resumed twice)', resumedTwice);
  fail('signal ids answered as new more than once (one id written twice)', writtenTwice);
  fail('signals answered but not stored under their id with their payload', missing);
  fail('signals the signaller could not send in two minutes', unsent);
  fail('steps after a wait not run for exactly one resume with its output', downstream);
  fail('sleeps that did not end with a null output', sleeps);
  return report;
}
