/**
 * The tick: one bounded pass of work. Recover what dead passes left, then
 * claim ready tasks in batches, run them concurrently up to a limit, settle
 * them, and stop claiming when the time budget is nearly spent, so the pass
 * returns before its platform would kill it.
 *
 * A cron route, a webhook, a test and a long-lived worker all drive the engine
 * through this one function.
 */
import { checkWhole } from '../model/checks.js';
import type { Redact } from '../model/redact.js';
import { claim, type ClaimedTask } from './claim.js';
import { ConfigError, OutliveError, toError } from '../model/errors.js';
import { execute, HandBackError, handedBack } from './execute.js';
import { LeaseWatch } from './lease-watch.js';
import { Settler } from './settler.js';
import { toExecutor, toPool, type Database } from '../db/executor.js';
import { withPreparedStatements, type PreparedStatements } from '../db/statements.js';
import { announceTasks } from './known-tasks.js';
import { recover } from './recover.js';
import { taskRegistry, type TaskList } from '../model/task.js';
import { checkName } from '../model/checks.js';
import { WAIT_TASK } from '../model/wait.js';
import { beginWaits } from './wait.js';
import { telemetry } from '../model/telemetry.js';
import { errorOf, outcomeOf, TraceReads, waitKeys } from './trace.js';

/** Waits a pass claims at once when a claim found more due than it took. */
const WAIT_BATCH = 500;

/** Options of one pass. */
export interface TickOptions {
  /**
   * The tasks this pass can run. It claims only rows of these names: a task
   * no pass knows stays pending, and `explainRun` says so.
   */
  tasks: TaskList;
  /** Wall-clock budget of the pass in ms. Default 30 s. Only tasks whose timeout fits in what is left are claimed. */
  budgetMs?: number;
  /** Handlers running at once. Default 10. */
  concurrency?: number;
  /**
   * Most tasks claimed ahead of free slots, waiting in the pass to start as
   * soon as one frees, so a busy pass claims (and settles) in bigger batches.
   * The pass prefetches only as many as its handlers' measured speed can
   * start within a quarter of the lease grace; a prefetched task that still
   * waited longer than half the grace, or whose timeout no longer fits in the
   * budget, is handed back unstarted. Default 1,000; 0 claims only for free slots.
   */
  prefetch?: number;
  /** Claim only from these queues. Default: all. */
  queues?: readonly string[];
  /** Run the recovery of expired leases, beside the pass's first claim. Default true. */
  recover?: boolean;
  /**
   * Whether the pass sends its claims and settles as named prepared
   * statements. `'auto'` (the default) does until the database says its
   * path cannot keep them (a transaction pooler without prepared-statement
   * support: PgBouncer before 1.21, or with `max_prepared_statements = 0`),
   * then sends them unnamed for as long as the process lives; `true` forces
   * them (a direct connection), `false` never sends them.
   */
  preparedStatements?: PreparedStatements;
  /** Stop claiming after this many tasks. */
  maxTasks?: number;
  /** The time the pass acts at, for tests; default: the database's clock. */
  now?: Date;
  /** Prefix of the lease owner, to tell passes apart in rows. Default "pass". */
  owner?: string;
  /** Lease time beyond a task's timeout, for its settle to land. Default 5 s. */
  leaseGraceMs?: number;
  /**
   * The longest lease a claim takes (plus the grace). Past it, the pass
   * holds its tasks through its own lease (one row of `outlive.leases`,
   * renewed every half lease while it runs them), so a task whose pass died
   * is recovered within one lease, not one timeout. Default 30 s.
   */
  leaseMs?: number;
  /** Time kept back at the end of the budget for the last settles. Default 250 ms. */
  reserveMs?: number;
  /** Aborting stops claiming; running handlers go on to finish and settle. */
  signal?: AbortSignal;
  /**
   * Aborting fires the signal of running handlers with a {@link HandBackError}
   * and hands their rows back: pending again at once, the attempt not counted
   * (unless the handler still finished). For graceful shutdown: abort
   * `signal` first, then this one when the grace period is over.
   */
  abort?: AbortSignal;
  /**
   * Tells a running pass that new work may be ready: dispatch an event named
   * `wake` on it (the worker does, on every NOTIFY that arrives while its
   * pass runs), and a pass with free slots claims at once, even while a long
   * task holds the others. Given this, a pass whose last claim came back
   * short claims again only when woken, or when one of its own settles may
   * have made work ready (a task of a run, a retry); without it, it asks
   * again as its tasks finish.
   */
  wakeups?: EventTarget;
  /**
   * How often the pass looks at the tasks it has been running for a while:
   * renews its own lease when half of it is spent, and fires the signal of
   * the tasks it lost (cancelled, recovered), read without writing them.
   * Default 1 s.
   */
  leaseCheckMs?: number;
  /**
   * Blanks the deployment's secrets out of the errors the pass stores in
   * rows (`last_error`, `errors`), as its log does: a handler's error may
   * quote a connection string or a token. The serverless entry points give
   * the invocation's; the worker builds one from its connection strings.
   */
  redact?: Redact;
}

/** What one pass did. */
export interface TickReport {
  /** The lease owner this pass used. */
  owner: string;
  /** Tasks this pass started. */
  claimed: number;
  succeeded: number;
  /** Attempts that failed and were scheduled to run again. */
  retried: number;
  /** Tasks that failed for good. */
  failed: number;
  /** Tasks with expired leases handed back (or failed) by recovery. */
  recovered: number;
  /** Outcomes dropped because the lease was lost before settling. */
  lostLeases: number;
  /** Tasks handed back (pending again, attempt not counted): aborted by the pass's `abort`, or prefetched and never started. */
  released: number;
  /** Tasks that said "not yet" (SnoozeError): pending again after their delay, attempt not counted. */
  snoozed: number;
  /** Waits (waitFor, sleepStep) this pass parked until their signal or deadline; those it ended count as succeeded or failed. */
  parked: number;
  durationMs: number;
  /**
   * Why the pass ended: `drained` when no ready task's timeout fitted in what
   * was left of the budget (usually: none was ready), `budget` when the time
   * ran out, `maxTasks`, or `signal` when aborted.
   */
  stoppedBy: 'drained' | 'budget' | 'maxTasks' | 'signal';
}

/** Thrown when the database failed under a pass; `report` says what it did before. */
export class PassError extends OutliveError {
  constructor(
    message: string,
    readonly report: TickReport,
    options: { cause: unknown },
  ) {
    super(message, options);
  }
}

export { LeaseLostError } from './lease-watch.js';

function positiveInt(name: string, value: number | undefined, fallback: number): number {
  return checkWhole(`tick option ${name}`, value ?? fallback, { min: 1 });
}

/**
 * Runs one bounded pass over `db` (a pg or Neon Pool, or a drizzle database
 * built on one) and reports what it did.
 *
 * ```ts
 * const report = await tick(pool, { tasks: [sendWelcome], budgetMs: 20_000 });
 * ```
 */
export async function tick(db: Database, options: TickOptions): Promise<TickReport> {
  const started = performance.now();
  const pool = withPreparedStatements(toPool(db), options.preparedStatements ?? 'auto');
  const exec = toExecutor(pool);
  const registry = taskRegistry(options.tasks);
  const budgetMs = positiveInt('budgetMs', options.budgetMs, 30_000);
  const concurrency = positiveInt('concurrency', options.concurrency, 10);
  const maxTasks = options.maxTasks === undefined ? Infinity : positiveInt('maxTasks', options.maxTasks, 1);
  const leaseGraceMs = positiveInt('leaseGraceMs', options.leaseGraceMs, 5_000);
  const leaseMs = positiveInt('leaseMs', options.leaseMs, 30_000);
  const leaseCheckMs = positiveInt('leaseCheckMs', options.leaseCheckMs, 1_000);
  const prefetch = options.prefetch ?? 1000;
  checkWhole('tick option prefetch', prefetch, { min: 0 });
  const reserveMs = checkWhole('tick option reserveMs', options.reserveMs ?? 250, { min: 0 });
  const queues = options.queues ? options.queues.map((q) => checkName('queue', q)) : null;
  const now = options.now ?? null;
  const owner = `${options.owner ?? 'pass'}:${globalThis.crypto.randomUUID()}`;
  // The longest timeout this pass can claim, at its start.
  const claimable = budgetMs - reserveMs;
  const deadline = started + claimable;
  let shortest = Infinity;
  for (const task of registry.values()) shortest = Math.min(shortest, task.timeoutMs);
  if (shortest !== Infinity && claimable < shortest) {
    throw new ConfigError(
      `outlive: a pass of ${budgetMs} ms (${reserveMs} ms kept back to settle) can claim none of its tasks: the shortest timeoutMs is ${shortest} ms. Raise budgetMs or lower the tasks' timeoutMs.`,
    );
  }

  const report: TickReport = {
    owner,
    claimed: 0,
    succeeded: 0,
    retried: 0,
    failed: 0,
    recovered: 0,
    lostLeases: 0,
    released: 0,
    snoozed: 0,
    parked: 0,
    durationMs: 0,
    stoppedBy: 'drained',
  };
  let dbError: unknown = null;
  // With telemetry registered, the pass is a span and each attempt one;
  // without, these stay null and cost one check per task.
  const observer = telemetry();
  const passSpan = observer?.startPass({ owner, queues }) ?? null;
  const traces = passSpan?.recording ? new TraceReads(exec) : null;

  // Progress (a handler finishing, a settle landing) wakes the claim loop.
  let wake: (() => void) | null = null;
  const progress = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const nextProgress = () => new Promise<void>((resolve) => (wake = resolve));

  let running = 0;
  // Counts what may have made work ready: a settle of a run's task (it may
  // have released dependents) or of a retry, wake-ups, and, in a pass that
  // nothing can wake, a handler finishing (it may have enqueued). The queue
  // is dry while nothing has happened since a claim that began at that count
  // came back short; counting, not a flag, so that what happens while a
  // claim is in flight (a settle committing, a NOTIFY, an enqueue) is not
  // lost when it returns.
  let readyCount = 0;
  let dryAt = -1;
  // A claim takes tasks with flow control only for free handlers
  // (ClaimRequest.governedLimit): one that got its cap may have left more.
  let governedMore = false;
  const dry = () => dryAt === readyCount && !governedMore;
  const settler = new Settler(
    pool,
    owner,
    now,
    ({ rows, size, kept, freedSlots }) => {
      // A slot given back may let a task waiting for its key start.
      if (freedSlots) readyCount++;
      for (const r of rows) {
        if ((r.run_id && r.state !== 'released') || r.state === 'pending' || r.state === 'snoozed') readyCount++;
        if (r.state === 'succeeded') report.succeeded++;
        else if (r.state === 'pending') report.retried++;
        else if (r.state === 'snoozed') report.snoozed++;
        else if (r.state === 'released') report.released++;
        else report.failed++;
      }
      report.lostLeases += size - rows.length - kept;
      progress();
    },
    (err) => {
      dbError ??= err;
    },
    passSpan,
    options.redact,
  );
  const leases = new LeaseWatch(exec, { owner, now, leaseMs, leaseGraceMs }, leaseCheckMs);

  const onWake = () => {
    readyCount++;
    progress();
  };
  options.wakeups?.addEventListener('wake', onWake);

  // One listener for the whole pass, not one per task.
  const handBackAll = () => leases.handBackAll();
  options.abort?.addEventListener('abort', handBackAll, { once: true });

  const start = (row: ClaimedTask) => {
    running++;
    const abort = leases.track(row.id);
    if (options.abort?.aborted) abort.abort(new HandBackError());
    const since = performance.now();
    const span = traces && passSpan!.startAttempt({
      id: row.id,
      task: row.name,
      queue: row.queue,
      attempt: row.attempts,
      runId: row.run_id,
      limitKeys: row.limits ? row.limits.map((l) => l.k) : null,
      step: row.step ?? null,
      link: row.trace_context ?? null,
    });
    const run = () => execute(registry.get(row.name), row, { attempt: abort, db: exec, heartbeat: leases.heartbeat, owner });
    void (span ? span.run(run) : run()).then((outcome) => {
      const took = performance.now() - since;
      if (span) {
        const end = { outcome: outcomeOf(outcome), durationMs: took, endTime: performance.timeOrigin + performance.now(), error: errorOf(outcome) };
        traces!.after(row, (detail) => {
          span.end({ ...end, detail });
          observer!.attemptFinished({ task: row.name, queue: row.queue, outcome: end.outcome, durationMs: took, startLatencyMs: detail.startLatencyMs });
          if (detail.resumeLatencyMs != null) observer!.signalResumed({ queue: row.queue, latencyMs: detail.resumeLatencyMs });
        });
      }
      avgHandlerMs = avgHandlerMs === null ? took : avgHandlerMs * 0.8 + took * 0.2;
      leases.untrack(row.id);
      running--;
      if (!options.wakeups) readyCount++;
      settler.push(outcome);
      fill();
      progress();
    });
  };

  // Waits claimed take no handler: each claim's are begun in one statement,
  // beside the handlers, one such statement at a time; meanwhile claims leave
  // waits out, so tasks due behind many waits (a storm of deadlines) start
  // between their batches. A claim full of waits may have left more: they
  // are claimed on their own, WAIT_BATCH at a time, until a batch comes back
  // short (docs/benchmarks.md, "Waits and signals").
  let beginning = 0;
  const begin = async (first: ClaimedTask[], full: boolean) => {
    beginning++;
    try {
      let rows = first;
      for (;;) {
        const span = traces && passSpan!.startWaits({ count: rows.length, keys: waitKeys(rows) });
        const { outcomes, parked } = await beginWaits(exec, rows, owner, now);
        span?.end({ parked, ended: outcomes.length });
        report.parked += parked;
        for (const outcome of outcomes) settler.push(outcome);
        progress();
        const remaining = deadline - performance.now();
        if (!full || remaining <= 0 || options.signal?.aborted || options.abort?.aborted) break;
        rows = await claim(exec, { owner, limit: WAIT_BATCH, maxTimeoutMs: remaining, queues, names: [WAIT_TASK], leaseGraceMs, leaseMs, now, governedLimit: 0 });
        full = rows.length === WAIT_BATCH;
        if (rows.length === 0) break;
      }
    } catch (err) {
      dbError ??= err;
    } finally {
      beginning--;
      // More waits may be due than were taken.
      readyCount++;
      progress();
    }
  };

  // Claimed rows wait here for a free slot, in claim order.
  const buffer: { row: ClaimedTask; at: number }[] = [];
  const staleAfterMs = leaseGraceMs / 2;
  const handBack = (row: ClaimedTask) => {
    traces?.forget(row.id);
    settler.push(handedBack(row));
  };
  // Handler time, smoothed: how fast buffered tasks will get a slot.
  let avgHandlerMs: number | null = null;
  const bufferLimit = () => {
    if (prefetch === 0) return 0;
    if (avgHandlerMs === null) return Math.min(prefetch, concurrency);
    // As many as the handlers start in a quarter of the lease grace: claims
    // of ~500 rows in a drain (docs/benchmarks.md, "What the Postgres CPU buys").
    return Math.max(0, Math.min(prefetch, Math.floor((concurrency * staleAfterMs) / 2 / Math.max(1, avgHandlerMs))));
  };
  const fill = () => {
    while (running < concurrency && buffer.length > 0 && report.claimed < maxTasks) {
      const { row, at } = buffer.shift()!;
      const t = performance.now();
      // Its lease started at the claim: one that waited too long, or that can
      // no longer finish within the budget, goes back unstarted.
      if (t - at > staleAfterMs || row.timeout_ms > deadline - t || options.signal?.aborted || options.abort?.aborted) handBack(row);
      else {
        report.claimed++;
        start(row);
      }
    }
  };

  // Recovery runs beside the claims, on a connection of its own, not before
  // them: a pass woken for a task just enqueued claims it at once. Rows it
  // hands back are due a second later at the earliest (their backoff), so the
  // pass's claims would not have taken them anyway. Awaited before the pass
  // returns; a database error there fails the pass like any other, after its
  // claimed tasks have run and settled. Before, the task that woke a worker's
  // pass due to recover (once per poll interval) waited for recovery's three
  // round trips (docs/benchmarks.md, run G and after).
  // First the pass says which task names it knows (one statement, writing a
  // name at most once a minute), then recovers.
  // Every pass begins waits: they run no handler of the app's.
  const handled = [...registry.keys()];
  const names = [...handled, WAIT_TASK];
  let background = true;
  const recovering = (async () => {
    await announceTasks(exec, names, claimable, now, pool);
    if (options.recover === false) return;
    const r = await recover(pool, { now });
    report.recovered = r.rows.length;
    // A recount may have made tasks ready now; recovered ones are due later.
    if (r.recounted > 0) {
      readyCount++;
      progress();
    }
  })().then(
    () => (background = false),
    (err: unknown) => {
      background = false;
      dbError ??= err;
    },
  );
  try {
    // Claim in batches of at least half the slots and half the room (slots
    // plus prefetch): a claim or settle costs mostly per statement up to a
    // few hundred rows (docs/benchmarks.md, "What the Postgres CPU buys").
    const minBatch = Math.max(1, Math.floor(concurrency / 2));
    // Tasks with flow control go to handlers as they free, not in batches: a
    // fair turn waits for the next such claim.
    const governedBatch = Math.max(1, Math.floor(concurrency / 10));

    for (;;) {
      if (options.signal?.aborted || options.abort?.aborted) {
        report.stoppedBy = 'signal';
        break;
      }
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        report.stoppedBy = 'budget';
        break;
      }
      if (report.claimed >= maxTasks) {
        report.stoppedBy = 'maxTasks';
        break;
      }
      fill();
      // Everything finished, and nothing can have become ready through us
      // since the queue came back dry: done, without one more claim to find
      // it empty (new enqueues wake the next pass through their NOTIFY or nudge).
      if (dry() && running === 0 && beginning === 0 && settler.unsettled === 0 && buffer.length === 0) {
        if (!background) break;
        await recovering;
        continue;
      }
      const capacity = concurrency + bufferLimit();
      const left = maxTasks - report.claimed - buffer.length;
      const room = Math.min(capacity - running - buffer.length, left);
      const free = Math.min(concurrency - running - buffer.length, left);
      // After a short claim, a pass waits for something that may have made
      // work ready: asking again after every finished task cost the worker
      // one empty claim per lone task (401 claims for 200 tasks in the
      // bench's latency phase). A pass that cannot be woken (a cron or
      // webhook pass) counts its tasks' finishes, to run what they enqueued.
      const wantPlain = room > 0 && dryAt !== readyCount &&
        (room >= Math.max(minBatch, capacity >> 1) || (running === 0 && buffer.length === 0));
      const wantGoverned = governedMore && free >= governedBatch;
      if (wantPlain || wantGoverned) {
        const seen = readyCount;
        const limit = wantPlain ? room : free;
        const governedLimit = Math.max(0, free);
        const rows = await claim(exec, {
          owner,
          limit,
          maxTimeoutMs: remaining,
          queues,
          names: beginning > 0 ? handled : names,
          leaseGraceMs,
          leaseMs,
          now,
          governedLimit,
        });
        if (traces && rows.length > 0) traces.read(rows);
        const at = performance.now();
        const short = rows.length < limit;
        let governed = 0;
        for (const row of rows) if (row.fair_key != null) governed++;
        if (short) dryAt = seen;
        else if (wantPlain || governed < rows.length) dryAt = -1;
        if (governedLimit > 0) governedMore = governed === governedLimit;
        let waits: ClaimedTask[] | null = null;
        for (const row of rows) {
          if (row.name === WAIT_TASK) (waits ??= []).push(row);
          else buffer.push({ row, at });
        }
        if (waits) void begin(waits, !short);
        fill();
        // A full batch means there may be more: claim again while there is
        // room. A short one means the queue ran dry for now: wait for a
        // settle that may have made work ready, or a wake-up, unless one
        // came while this claim was in flight. With nothing left to wait
        // for, the top of the loop decides whether the pass is done.
        const idle = running === 0 && beginning === 0 && settler.unsettled === 0 && buffer.length === 0;
        if (idle || ((!short || readyCount !== seen) && running + buffer.length < capacity)) continue;
      }
      await nextProgress();
    }
  } catch (err) {
    dbError ??= err;
  }

  // Hand back what was claimed but not started; let what was started finish
  // (each handler is bounded by its timeout, which fits in the budget) and settle.
  for (const { row } of buffer.splice(0)) handBack(row);
  while (running > 0 || beginning > 0 || settler.unsettled > 0) {
    await nextProgress();
  }
  await settler.flush();
  await recovering;
  await leases.stop();
  options.abort?.removeEventListener('abort', handBackAll);
  options.wakeups?.removeEventListener('wake', onWake);
  report.durationMs = Math.round(performance.now() - started);
  await traces?.settled();
  passSpan?.end(report, dbError ?? undefined);
  if (dbError) {
    const err = toError(dbError);
    throw new PassError(`outlive: the pass ${owner} hit a database error: ${err.message}`, report, { cause: err });
  }
  return report;
}
