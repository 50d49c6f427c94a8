/**
 * The event tick: a long-lived worker for apps that can keep a process.
 *
 * It holds one Postgres connection on `LISTEN outlive`. The enqueue insert
 * trigger NOTIFYs that channel after commit, and the worker drains ready work
 * at once through the same {@link tick} pass the serverless functions use.
 * Polling is the safety net: a missed notification, a dropped connection and
 * a task whose run_at arrives later are picked up within `pollIntervalMs`.
 * Its own clock fires the schedules ({@link enqueueDue}) and runs retention.
 *
 * Node only: it needs a socket that stays open, which Workers do not keep.
 */
import { checkWhole } from '../model/checks.js';
import { printable, quoted } from '../model/printable.js';
import { setMaxListeners } from 'node:events';
import pg from 'pg';
import { CLAIM_FUNCTION, untilKeyWakes } from '../pass/claim.js';
import { toExecutor } from '../db/executor.js';
import { Listener } from './listener.js';
import { ConfigError, toError } from '../model/errors.js';
import { connectionSecrets, redactor, type Redact } from '../model/redact.js';
import { applyRetention, retentionConfig, type RetentionOptions, type RetentionReport } from '../maintenance/retention.js';
import { enqueueDue, isSchedule, ScheduleError, type AnySchedule, type EnqueueDueReport } from '../maintenance/schedule.js';
import { taskRegistry, type AnyTask, type TaskList } from '../model/task.js';
import { checkName } from '../model/checks.js';
import { tick, type TickOptions, type TickReport } from '../pass/tick.js';
import type { PreparedStatements } from '../db/statements.js';

/** Where the worker writes what it does. */
export interface WorkerLogger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

/** Everything `createWorker` takes. */
export interface WorkerOptions {
  /** A Postgres URL; the worker makes its own pool and closes it on stop. Give this or `pool`. */
  connectionString?: string;
  /** A pool to run passes on (not closed on stop). The LISTEN connection is opened with the same settings. */
  pool?: pg.Pool;
  /** The tasks this worker runs. Tasks of the schedules are added. */
  tasks: TaskList;
  /** Schedules the worker's clock fires. Default none. */
  schedules?: readonly AnySchedule[];
  /** Handlers running at once. Default 10. */
  concurrency?: number;
  /** Only these queues. Default all. */
  queues?: readonly string[];
  /** The longest gap between passes when no notification arrives. Default 2,000 ms. */
  pollIntervalMs?: number;
  /**
   * Budget of one pass (the engine stops claiming when it is nearly spent, then
   * the worker starts the next). Default 5 minutes, or twice the longest task
   * timeout if that is longer, so every task fits in a pass.
   */
  budgetMs?: number;
  /** LISTEN for wake-ups. Default true; false leaves polling alone. */
  listen?: boolean;
  /**
   * A direct connection string for the LISTEN connection, when
   * `connectionString` or `pool` goes through a transaction pooler (which
   * does not deliver notifications). Default: the pool's own settings.
   */
  listenConnectionString?: string;
  /**
   * More secrets to blank out of the errors the worker stores in rows, beside
   * the password and connection strings it is given (which are always
   * blanked): an API key a handler's error might quote, say.
   */
  secrets?: readonly string[];
  /** application_name of the LISTEN connection, to find it in pg_stat_activity. Default "outlive-listener". */
  applicationName?: string;
  /** Reconnect backoff of the LISTEN connection. Default from 100 ms, doubling, up to 30 s. */
  reconnect?: { baseMs?: number; maxMs?: number };
  /** The longest the clock sleeps between schedule checks. Default 60,000 ms. */
  scheduleIntervalMs?: number;
  /** Retention run by the clock; false turns it off. Default on, with the defaults of {@link RetentionOptions}. */
  retention?: RetentionOptions | false;
  /** How often the clock runs retention. Default 10 minutes (sooner while it reports more to do). */
  retentionIntervalMs?: number;
  /** Whether passes send named prepared statements: see {@link TickOptions.preparedStatements}. Default `'auto'`. */
  preparedStatements?: PreparedStatements;
  /** Lease owner prefix of the passes. Default "worker". */
  owner?: string;
  /** Where to log. Default the console. */
  logger?: WorkerLogger;
  /** Called after every pass with its report. */
  onPass?: (report: TickReport) => void;
  /** Called after every schedule check that did something. */
  onSchedule?: (report: EnqueueDueReport) => void;
  /** Called after every retention run. */
  onRetention?: (report: RetentionReport) => void;
}

/** Counters since start. */
export interface WorkerStats {
  passes: number;
  claimed: number;
  succeeded: number;
  retried: number;
  failed: number;
  /** Notifications received on the LISTEN connection. */
  notifications: number;
  /** Times the LISTEN connection was lost. */
  disconnects: number;
  /** Times it was re-established. */
  reconnects: number;
  /** Tasks enqueued by the worker's schedule clock. */
  scheduled: number;
  /** Rows deleted by the worker's retention runs. */
  deleted: number;
  /** Passes, schedule checks and retention runs that hit an error. */
  errors: number;
}

/** Options of {@link Worker.stop}. */
export interface StopOptions {
  /**
   * How long to let the running pass finish its tasks before aborting them
   * through their AbortSignal. Default 30,000 ms. A second stop() with a
   * shorter grace shortens it.
   */
  graceMs?: number;
}

/** A worker made by {@link createWorker}. */
export interface Worker {
  /** Connects, starts listening, runs a first pass and starts the clock. Rejects if it cannot connect. */
  start(): Promise<void>;
  /** Stops claiming, lets running tasks finish within the grace period, then aborts them, and disconnects. */
  stop(options?: StopOptions): Promise<void>;
  /** Asks for a pass now (coalesced with one that is running). */
  wake(): void;
  /** Counters since start. */
  readonly stats: Readonly<WorkerStats>;
  /** `idle` before start, `running`, `stopping`, `stopped`. */
  readonly state: 'idle' | 'running' | 'stopping' | 'stopped';
}

const consoleLogger: WorkerLogger = {
  info: (m) => console.log(m),
  warn: (m) => console.warn(m),
  error: (m) => console.error(m),
};

function printableLogger(logger: WorkerLogger, redact: Redact): WorkerLogger {
  return {
    info: (m) => logger.info(printable(redact(m))),
    warn: (m) => logger.warn(printable(redact(m))),
    error: (m) => logger.error(printable(redact(m))),
  };
}

function whole(name: string, value: number | undefined, fallback: number, min = 1): number {
  return checkWhole(`worker option ${name}`, value ?? fallback, { min });
}

/**
 * Creates a worker. Options are checked here, so a wrong one fails before
 * anything connects.
 *
 * ```ts
 * const worker = createWorker({ connectionString: process.env.DATABASE_URL, tasks, schedules });
 * await worker.start();
 * process.once('SIGTERM', () => void worker.stop({ graceMs: 25_000 }));
 * ```
 */
export function createWorker(options: WorkerOptions): Worker {
  if (!options || (!options.pool && !options.connectionString)) {
    throw new ConfigError('outlive: createWorker needs a database: pass `connectionString` (a postgres:// URL) or `pool` (a pg.Pool)');
  }
  if (options.pool && options.connectionString) {
    throw new ConfigError('outlive: createWorker takes `connectionString` or `pool`, not both');
  }
  if (options.pool && !(options.pool instanceof pg.Pool)) {
    throw new ConfigError('outlive: createWorker `pool` must be a pg.Pool (the worker LISTENs over a node-postgres connection)');
  }
  const schedules = options.schedules ?? [];
  if (!Array.isArray(schedules) || !schedules.every(isSchedule)) {
    throw new ConfigError('outlive: createWorker `schedules` must be an array of defineSchedule() results');
  }
  // A schedule's task must be runnable by the worker that fires it.
  const given = taskRegistry(options.tasks);
  const all: AnyTask[] = [...given.values()];
  for (const s of schedules) all.push(s.task);
  const registry = taskRegistry(all);
  if (registry.size === 0) throw new ConfigError('outlive: createWorker needs at least one task in `tasks`');

  const concurrency = whole('concurrency', options.concurrency, 10);
  // A driver's error may quote the connection string or its password; neither the rows nor the log may keep it.
  const poolSettings = options.pool?.options as { connectionString?: unknown; password?: unknown } | undefined;
  const redact = redactor([
    ...connectionSecrets(options.connectionString),
    ...connectionSecrets(options.listenConnectionString),
    ...connectionSecrets(poolSettings?.connectionString),
    poolSettings?.password,
    ...(options.secrets ?? []),
  ]);
  const pollIntervalMs = whole('pollIntervalMs', options.pollIntervalMs, 2_000);
  // Keys wake on their own clock only for tasks with flow control; no other worker asks when.
  const governed = [...registry.values()].some((t) => t.flow !== null);
  const longest = Math.max(...[...registry.values()].map((t) => t.timeoutMs));
  const budgetMs = whole('budgetMs', options.budgetMs, Math.max(300_000, 2 * longest + 5_000));
  // A pass claims a task only while its timeout fits in what is left of the budget.
  if (budgetMs < longest + 1_000) {
    throw new ConfigError(
      `outlive: worker budgetMs (${budgetMs}) must exceed the longest task timeout (${longest} ms) by at least 1,000 ms, or that task is never claimed`,
    );
  }
  const scheduleIntervalMs = whole('scheduleIntervalMs', options.scheduleIntervalMs, 60_000);
  const retention = options.retention === false ? false : (options.retention ?? {});
  if (retention) retentionConfig(retention);
  const retentionIntervalMs = whole('retentionIntervalMs', options.retentionIntervalMs, 600_000);
  const reconnectBaseMs = whole('reconnect.baseMs', options.reconnect?.baseMs, 100);
  const reconnectMaxMs = whole('reconnect.maxMs', options.reconnect?.maxMs, 30_000);
  const listen = options.listen ?? true;
  const applicationName = options.applicationName ?? 'outlive-listener';
  const queues = options.queues ? options.queues.map((q) => checkName('queue', q)) : undefined;
  // Schedule names read from rows, and errors quoting them, may hold control
  // characters that would forge a log line or drive a terminal: escaped. And
  // an error may quote a secret, as in the rows: blanked out.
  const log = printableLogger(options.logger ?? consoleLogger, redact);
  const owner = options.owner ?? 'worker';

  const stats: WorkerStats = {
    passes: 0,
    claimed: 0,
    succeeded: 0,
    retried: 0,
    failed: 0,
    notifications: 0,
    disconnects: 0,
    reconnects: 0,
    scheduled: 0,
    deleted: 0,
    errors: 0,
  };
  let state: Worker['state'] = 'idle';
  let pool: pg.Pool | null = options.pool ?? null;
  const ownPool = !options.pool;
  // stop() fires `draining` at once: the running pass claims nothing more.
  // When the grace period is over it fires `abort`: the pass aborts its
  // handlers and hands their rows back, retryable at once, attempt not counted.
  const draining = new AbortController();
  const abort = new AbortController();
  // Every running handler listens on it: without this, concurrency above 10 draws Node's leak warning.
  setMaxListeners(concurrency + 10, abort.signal);

  const listener = listen
    ? new Listener({
        config: () => listenerConfig(),
        queues,
        reconnectBaseMs,
        reconnectMaxMs,
        pollIntervalMs,
        log,
        wake: () => wake(),
        count: (event) => stats[event]++,
        notify: (channel, payload) => pool!.query('SELECT pg_catalog.pg_notify($1, $2)', [channel, payload]),
      })
    : null;
  let pollTimer: ReturnType<typeof setTimeout> | undefined;
  /** When the last pass's keys wake by time (a rate, a pause), in ms; null: at the poll. */
  let keyWakeMs: number | null = null;
  let clockTimer: ReturnType<typeof setTimeout> | undefined;
  let passing: Promise<void> | null = null;
  const wakeups = new EventTarget();
  let again = false;
  let lastRecover = -Infinity;
  let clocking: Promise<void> | null = null;
  let nextRetentionAt = 0;
  let stopPromise: Promise<void> | null = null;
  let starting: Promise<void> | null = null;
  let graceTimer: ReturnType<typeof setTimeout> | undefined;
  let graceEndsAt = Infinity;

  const listenerConfig = (): pg.ClientConfig => ({
    ...(options.listenConnectionString
      ? { connectionString: options.listenConnectionString }
      : options.connectionString
        ? { connectionString: options.connectionString }
        : (pool!.options as pg.ClientConfig)),
    application_name: applicationName,
    // A connection that dies silently (a NAT dropping it) is noticed by TCP
    // keepalive instead of waiting forever for notifications that never come.
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
  });

  // --- passes -------------------------------------------------------------

  function wake(): void {
    if (state !== 'running') return;
    // Coalescing: a notification that arrives while a pass runs only asks for
    // one more pass after it. A burst of 10,000 enqueues makes a few passes
    // (the running one claims most of them), not 10,000 claim queries.
    if (passing) {
      // The running pass claims what it can now (it may be holding a long
      // task with slots free); one more pass after it catches the rest.
      wakeups.dispatchEvent(new Event('wake'));
      again = true;
      return;
    }
    clearTimeout(pollTimer);
    passing = runPasses().finally(() => {
      passing = null;
      if (state === 'running') {
        if (again) wake();
        // A few ms late, so the database's clock has passed the key's time.
        else pollTimer = setTimeout(wake, keyWakeMs === null ? pollIntervalMs : Math.min(pollIntervalMs, Math.max(0, keyWakeMs) + 5));
      }
    });
  }

  async function runPasses(): Promise<void> {
    keyWakeMs = null;
    do {
      again = false;
      let report: TickReport;
      // Recovery hands back leases that expired; one run per poll interval
      // finds them soon enough, without three more round trips (and a
      // connection) for every pass. The pass runs it beside its first claim,
      // so a woken pass does not wait for it (src/pass/tick.ts). (Before it ran
      // beside the claim, dropping it from most passes took p50
      // enqueue-to-start from 10.0 to 7.5 ms in scripts/worker-latency.ts.)
      const recover = performance.now() - lastRecover >= pollIntervalMs;
      if (recover) lastRecover = performance.now();
      try {
        report = await tick(pool!, {
          tasks: registry,
          concurrency,
          queues,
          budgetMs,
          owner,
          recover,
          wakeups,
          redact,
          signal: draining.signal,
          abort: abort.signal,
          ...(options.preparedStatements === undefined ? {} : { preparedStatements: options.preparedStatements }),
        });
      } catch (err) {
        stats.errors++;
        log.error(`outlive worker: pass failed: ${toError(err).message}; next try in ${pollIntervalMs} ms`);
        // Do not spin on a database that is down: the poll timer retries.
        again = false;
        return;
      }
      stats.passes++;
      stats.claimed += report.claimed;
      stats.succeeded += report.succeeded;
      stats.retried += report.retried;
      stats.failed += report.failed;
      try {
        options.onPass?.(report);
      } catch (err) {
        log.error(`outlive worker: onPass threw: ${toError(err).message}`);
      }
      // A pass that ran out of budget may have left ready work behind.
      if (report.stoppedBy === 'budget' || report.stoppedBy === 'maxTasks') again = true;
      if (governed && !again && report.stoppedBy === 'drained') {
        try {
          keyWakeMs = await untilKeyWakes(toExecutor(pool!));
        } catch (err) {
          log.error(`outlive worker: reading when keys wake: ${toError(err).message}`);
        }
      }
    } while (again && state === 'running');
  }

  // --- the clock: schedules and retention -------------------------------------

  function scheduleClock(ms: number): void {
    if (state !== 'running') return;
    clockTimer = setTimeout(() => {
      clocking = runClock().finally(() => {
        clocking = null;
      });
    }, Math.max(0, ms));
  }

  async function runClock(): Promise<void> {
    let sleep = scheduleIntervalMs;
    if (schedules.length > 0) {
      try {
        const r = await enqueueDue(pool!, schedules);
        report(r);
        // Wake just after the next slot; a few ms late so the database's clock has passed it.
        if (r.nextSlot) sleep = Math.min(sleep, r.nextSlot.getTime() - r.now.getTime() + 5);
      } catch (err) {
        stats.errors++;
        if (err instanceof ScheduleError) report(err.report);
        log.error(`outlive worker: schedules: ${toError(err).message}`);
      }
    }
    if (retention && Date.now() >= nextRetentionAt && state === 'running') {
      try {
        const r = await applyRetention(pool!, retention);
        const deleted = r.tasks + r.runTasks + r.runs + r.slots;
        stats.deleted += deleted;
        if (deleted > 0) log.info(`outlive worker: retention deleted ${r.tasks + r.runTasks} tasks, ${r.runs} runs, ${r.slots} slot records in ${r.durationMs} ms`);
        options.onRetention?.(r);
        // While there is a backlog, keep going in small steps instead of one long run.
        nextRetentionAt = Date.now() + (r.more ? 1_000 : retentionIntervalMs);
      } catch (err) {
        stats.errors++;
        log.error(`outlive worker: retention: ${toError(err).message}`);
        nextRetentionAt = Date.now() + retentionIntervalMs;
      }
    }
    if (retention) sleep = Math.min(sleep, nextRetentionAt - Date.now());
    scheduleClock(sleep);
  }

  function report(r: EnqueueDueReport): void {
    stats.scheduled += r.enqueued.length;
    for (const name of r.added) log.info(`outlive worker: schedule ${quoted(name)} added`);
    for (const name of r.changed) log.info(`outlive worker: schedule ${quoted(name)} changed`);
    for (const name of r.removed) log.info(`outlive worker: schedule ${quoted(name)} removed: it is no longer in the code`);
    if (r.skipped > 0) log.warn(`outlive worker: skipped ${r.skipped} missed schedule slot(s)`);
    if (r.enqueued.length > 0) {
      // The NOTIFY of the enqueue wakes the pass too; this covers listen: false.
      wake();
    }
    if (r.enqueued.length + r.added.length + r.changed.length + r.removed.length > 0) {
      try {
        options.onSchedule?.(r);
      } catch (err) {
        log.error(`outlive worker: onSchedule threw: ${toError(err).message}`);
      }
    }
  }

  // --- start and stop -----------------------------------------------------

  function start(): Promise<void> {
    if (state !== 'idle') return Promise.reject(new ConfigError(`outlive: a worker starts once; this one is ${state}`));
    state = 'running';
    starting = connect();
    return starting;
  }

  async function connect(): Promise<void> {
    try {
      if (!pool) {
        pool = new pg.Pool({ connectionString: options.connectionString, max: concurrency + 2 });
        // An idle pooled connection the server closes emits here; unheard, it would crash the process.
        pool.on('error', (err) => log.warn(`outlive worker: a pooled connection failed: ${err.message}`));
      }
      const [found] = (
        await pool.query<{ tasks: string | null; schedules: string | null; claim: string | null }>(
          `SELECT pg_catalog.to_regclass('outlive.tasks')::text AS tasks, pg_catalog.to_regclass('outlive.schedules')::text AS schedules,
                  pg_catalog.to_regprocedure($1)::text AS claim`,
          [CLAIM_FUNCTION],
        )
      ).rows;
      if (!found?.tasks) throw new ConfigError('outlive: the database has no outlive tables: run migrate() on it first');
      if (!found.claim) throw new ConfigError('outlive: the database has no outlive.claim_tasks function (migration 0014): run migrate() to bring it up to date');
      if (schedules.length > 0 && !found.schedules) {
        throw new ConfigError('outlive: the database has no outlive.schedules table: run migrate() to bring it up to date');
      }
      await listener?.start();
    } catch (err) {
      state = 'stopped';
      if (ownPool) await pool?.end().catch(() => undefined);
      if (err instanceof ConfigError) throw err;
      throw new ConfigError(`outlive: the worker cannot connect to the database: ${toError(err).message}`, { cause: err });
    }
    const hearing = !listener ? '' : listener.receives ? 'listening on "outlive", ' : 'LISTEN receives nothing here, ';
    log.info(
      `outlive worker: started (${hearing}polling every ${pollIntervalMs} ms, concurrency ${concurrency}, ` +
        `${registry.size} task(s), ${schedules.length} schedule(s))`,
    );
    wake();
    if (schedules.length > 0 || retention) scheduleClock(0);
  }

  function stop(stopOptions: StopOptions = {}): Promise<void> {
    const graceMs = stopOptions.graceMs ?? 30_000;
    if (!Number.isFinite(graceMs) || graceMs < 0) {
      return Promise.reject(new ConfigError(`outlive: stop graceMs must be a number >= 0, got ${String(stopOptions.graceMs)}`));
    }
    if (state === 'idle' || (state === 'stopped' && !stopPromise)) {
      state = 'stopped';
      return Promise.resolve();
    }
    // The earliest deadline asked for wins: a second stop (a second SIGINT) may shorten the grace.
    graceEndsAt = Math.min(graceEndsAt, Date.now() + graceMs);
    if (stopPromise) {
      if (graceTimer !== undefined) armGrace();
      return stopPromise;
    }
    state = 'stopping';
    draining.abort();
    stopPromise = (async () => {
      // A stop during start (a signal while connecting) lets the start finish first, so nothing it opens is left open.
      await starting?.catch(() => undefined);
      clearTimeout(pollTimer);
      clearTimeout(clockTimer);
      await listener?.stop();
      if (passing) {
        log.info(`outlive worker: stopping; waiting up to ${Math.max(0, graceEndsAt - Date.now())} ms for running tasks`);
        armGrace();
        await passing;
      }
      clearTimeout(graceTimer);
      await clocking;
      if (ownPool) await pool?.end().catch(() => undefined);
      state = 'stopped';
      log.info('outlive worker: stopped');
    })();
    return stopPromise;
  }

  function armGrace(): void {
    clearTimeout(graceTimer);
    graceTimer = setTimeout(() => {
      if (!passing) return;
      log.warn('outlive worker: grace period over; aborting the tasks still running');
      abort.abort();
    }, Math.max(0, graceEndsAt - Date.now()));
  }

  return {
    start,
    stop,
    wake,
    get stats() {
      return stats;
    },
    get state() {
      return state;
    },
  };
}
