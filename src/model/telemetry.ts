/**
 * Telemetry: the points where outlive tells an observer what it does, and
 * the one holder of that observer. `outlive/otel` implements it with
 * `@opentelemetry/api`, so the core imports no OpenTelemetry package.
 */

/** How an attempt ended, as the settle will write it. */
export type AttemptOutcome = 'succeeded' | 'retried' | 'failed' | 'snoozed' | 'released';

/** An error as a span records it. */
export interface TelemetryError {
  name: string;
  message: string;
  stack?: string;
}

/** The producer span of one enqueue (of one row or many of one task). */
export interface SendSpan {
  /** The span's W3C trace context as the rows store it (`tasks.trace_context`); null when nothing is recording. */
  readonly context: string | null;
  /** Ends the span; with the error that made the enqueue fail, if one did. */
  end(error?: unknown): void;
}

/** What an enqueue writes: one task's rows, or a run's steps. */
export interface SendInfo {
  /** The task's name, or for a run its name. */
  task: string;
  queue: string;
  /** Rows written by this one statement. */
  count: number;
  /** Set for a run's steps. */
  run?: string;
}

/** One attempt as the pass starts it. */
export interface AttemptInfo {
  id: string;
  task: string;
  queue: string;
  attempt: number;
  runId: string | null;
  /** The limit keys it holds slots of. */
  limitKeys: readonly string[] | null;
  /** Its step key in a run; null for a task on its own. */
  step: string | null;
  /** The enqueue's trace context (`tasks.trace_context`), to link to; null for none. */
  link: string | null;
}

/** What the pass knows of an attempt once it ends: a step's resume latency is read beside the claim. */
export interface AttemptDetail {
  /** Time from when it was due to its claim, in ms; null when not known (a step of a run). */
  startLatencyMs: number | null;
  /** A step after a wait a signal ended: from the wait's end to this step's claim, in ms. */
  resumeLatencyMs?: number | null;
}

/** How one attempt ended. */
export interface AttemptEnd {
  outcome: AttemptOutcome;
  durationMs: number;
  /** When it ended (ms since the epoch, as `performance.timeOrigin + performance.now()`): the span may end later. */
  endTime: number;
  detail: AttemptDetail;
  error?: TelemetryError;
}

/** The consumer span of one attempt. */
export interface AttemptSpan {
  /** Runs the handler with this span as the active context, so what it traces nests under it. */
  run<T>(fn: () => T): T;
  end(end: AttemptEnd): void;
}

/** The settle span of one batch of outcomes. */
export interface SettleSpan {
  end(settled: number, error?: unknown): void;
}

/** The span of beginning a claim's waits. */
export interface WaitsSpan {
  /** `parked` waits until their signal or deadline, `ended` with a signal kept for them or at their deadline. */
  end(result: { parked: number; ended: number }, error?: unknown): void;
}

/** The span of one pass; the attempts and settles it makes are its children. */
export interface PassSpan {
  /**
   * Whether anything records the pass's attempts (a sampled span, or
   * metrics): when false the pass reads no trace contexts and starts no
   * attempt spans, so an SDK-less app pays nothing per task.
   */
  readonly recording: boolean;
  startAttempt(info: AttemptInfo): AttemptSpan;
  startSettle(count: number): SettleSpan;
  /** The span of beginning one claim's waits (`waitFor`, `sleepStep`): `keys` are the signal keys among them. */
  startWaits(info: { count: number; keys: readonly string[] }): WaitsSpan;
  /** Ends the pass with what it did, or the error it failed with. */
  end(report: { claimed: number; stoppedBy: string }, error?: unknown): void;
}

/** A metric point: an attempt finished. */
export interface AttemptRecord {
  task: string;
  queue: string;
  outcome: AttemptOutcome;
  durationMs: number;
  /** Time from when it was due to its claim, in ms; null when not known. */
  startLatencyMs: number | null;
}

/** A metric point: the step after a wait a signal ended was claimed. */
export interface SignalRecord {
  queue: string;
  /** From the wait's end to the step's claim, in ms (`/metrics`' signal to resume). */
  latencyMs: number;
}

/**
 * An observer of outlive: spans and metric points. `outlive/otel`'s
 * `instrument()` registers one made with OpenTelemetry; an app may register
 * its own with {@link setTelemetry}.
 */
export interface Telemetry {
  startSend(info: SendInfo): SendSpan;
  startPass(info: { owner: string; queues: readonly string[] | null }): PassSpan;
  attemptFinished(record: AttemptRecord): void;
  /** A step after a wait its signal ended started its first attempt: the point for a signal-to-resume metric. */
  signalResumed(record: SignalRecord): void;
  /** Exports what is buffered; the platforms' routes await it in `waitUntil`. Never rejects. */
  flush(): Promise<void>;
}

let current: Telemetry | null = null;

/** The registered observer, or null: callers check it once per point. */
export function telemetry(): Telemetry | null {
  return current;
}

/** Registers an observer (null removes it); returns the one it replaced. */
export function setTelemetry(next: Telemetry | null): Telemetry | null {
  const previous = current;
  current = next;
  return previous;
}

/** Longest trace context a row stores: a traceparent (55) and a tracestate (at most 512 by W3C), with room to spare. */
export const MAX_TRACE_CONTEXT = 1024;

/**
 * Writes rows inside the producer span of their enqueue: `write` gets the
 * span's trace context to store (null with no observer, and then nothing
 * else is done).
 */
export async function withSendSpan<R>(info: SendInfo, write: (context: string | null) => Promise<R>): Promise<R> {
  const t = current;
  if (t === null) return write(null);
  const span = t.startSend(info);
  let result: R;
  try {
    result = await write(span.context);
  } catch (err) {
    span.end(err);
    throw err;
  }
  span.end();
  return result;
}
