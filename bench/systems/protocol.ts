/**
 * What the orchestrator (run.ts) and the system processes (child.ts) say to
 * each other, and the shape every system driver has.
 *
 * Every system runs in processes of its own: outlive (both ways) on the
 * machine's Node, graphile-worker and pg-boss on a Node 22 binary. The
 * orchestrator only creates databases, starts processes, reads Postgres
 * statistics and writes the report; it never runs a job itself.
 */

/**
 * The systems under test, in the order they take turns. `outlive-drop` is
 * outlive with its task defined with `keepSucceeded: false` (a success's row
 * is deleted by its settle, as graphile-worker deletes every completed job).
 */
export const SYSTEMS = ['outlive', 'outlive-drop', 'graphile-worker', 'pg-boss'] as const;
export type SystemName = (typeof SYSTEMS)[number];

/**
 * A job's payload, the same for every system: `i` numbers the job within its
 * phase, so the worker can count runs per job; `t` is the epoch time in
 * milliseconds (with fraction) at which the enqueuer called enqueue, for the
 * latency phase.
 */
export interface Payload {
  i: number;
  t?: number;
  /**
   * The liveness phase's jobs: the handler waits this long (ms) before it
   * returns, mostly waiting as a model call does. Drivers enqueue such jobs
   * with what a job that long needs (outlive: a timeoutMs above it; pg-boss:
   * a per-job heartbeat).
   */
  sleepMs?: number;
}

/** How a worker process runs jobs. */
export interface WorkerSettings {
  /** Handlers running at once in this process. */
  concurrency: number;
}

/**
 * One system as the harness drives it. A driver lives in a child process and
 * holds that process's connections; `run` is the no-op job body the harness
 * hands to the worker, which only counts.
 */
export interface Driver {
  readonly name: SystemName;
  /** The version of the package under test. */
  version(): string;
  /** The settings its worker runs with, in a line for the report. */
  settings(concurrency: number): string;
  /** Puts the system's schema into an empty database (done once per run, into a template). */
  install(url: string): Promise<void>;
  /** Connects (and warms one connection) so that later calls pay no connection setup. */
  open(url: string): Promise<void>;
  /** Enqueues one job with the system's own one-job call, committed on its own. */
  enqueueOne(payload: Payload): Promise<void>;
  /** Enqueues one job with the system's own one-job call inside BEGIN ... COMMIT on one client. */
  enqueueOneInTransaction(payload: Payload): Promise<void>;
  /** Enqueues many jobs with the system's bulk call. */
  enqueueMany(payloads: Payload[]): Promise<void>;
  /**
   * Starts a long-lived worker that calls `run` once per job it executes; the
   * job is done when what `run` returns has resolved (a promise only for
   * jobs with `sleepMs`).
   */
  startWorker(settings: WorkerSettings, run: (payload: Payload) => void | Promise<void>): Promise<void>;
  /** Stops the worker after its in-flight jobs settle. */
  stopWorker(): Promise<void>;
  close(): Promise<void>;
}

/** A request from the orchestrator; answered by a {@link Reply} with the same id. */
export interface Request {
  id: number;
  op: string;
  args: Record<string, unknown>;
}

/** The answer to one {@link Request}. */
export type Reply = { id: number; ok: true; result: unknown } | { id: number; ok: false; error: string };

/** Sent by a worker process on its own while it runs: how many jobs it has run so far. */
export interface Progress {
  event: 'progress';
  ran: number;
}

/** What a worker process reports when it stops. */
export interface WorkerReport {
  /** Jobs whose handler ran here (counting repeats). */
  ran: number;
  /** Runs per job index, base64 of a Uint8Array (saturating at 255). */
  counts: string;
  /** Epoch ms of the first and the last handler call here; null if none ran. */
  firstRunAt: number | null;
  lastRunAt: number | null;
  /** Enqueue-to-start latency of each job, in ms, for jobs that carried `t`. */
  latencies: number[];
}

/** Client-side costs a process counted since its counters were last reset. */
export interface Counters {
  /** Statements sent (node-postgres `Client#query` calls): each is one round trip. */
  queries: number;
  /** CPU time of this Node process, in ms (user + system). */
  cpuMs: number;
  /** The statements sent, by the start of their text, most frequent first (at most 12). */
  statements: StatementStat[];
}

/** How often one kind of statement was sent, and its total wall time as the client saw it. */
export interface StatementStat {
  /** The first 80 characters of the statement, whitespace folded. */
  text: string;
  n: number;
  ms: number;
}

/** The epoch time in ms with sub-millisecond precision, comparable across processes on one machine. */
export function epochMs(): number {
  return performance.timeOrigin + performance.now();
}
