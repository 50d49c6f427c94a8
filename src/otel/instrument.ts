/**
 * `outlive/otel`: outlive's spans and metrics through `@opentelemetry/api`.
 *
 * ```ts
 * import { instrument } from 'outlive/otel';
 * instrument(); // the globally registered tracer and meter providers
 * ```
 *
 * Spans follow OpenTelemetry's messaging conventions with
 * `messaging.system = "outlive"`: `send {task}` (PRODUCER) at enqueue, whose
 * W3C context the rows store; `outlive pass` per pass, a child of whatever
 * span is active when the pass starts (a drain's or cron's request span);
 * `process {task}` (CONSUMER) per attempt, a child of its pass, linked to
 * its enqueue's span; `settle` (CLIENT) per batch of outcomes. Metrics:
 * `outlive.task.start_latency` and `outlive.attempt.duration` (histograms,
 * seconds), `outlive.attempts` (counter, by outcome),
 * `outlive.signal.resume_latency` (histogram, seconds).
 *
 * This is the only file that imports `@opentelemetry/api` (an optional
 * peer): an app that does not import `outlive/otel` needs it neither
 * installed nor resolvable by its bundler.
 */
import * as api from '@opentelemetry/api';
import {
  MAX_TRACE_CONTEXT,
  setTelemetry,
  telemetry,
  type AttemptEnd,
  type AttemptInfo,
  type AttemptRecord,
  type PassSpan,
  type SendInfo,
  type SignalRecord,
  type Telemetry,
} from '../model/telemetry.js';

// The hook's types and holder are the core's (`outlive`): this entry adds only what needs the API.

/** Options of {@link instrument}. */
export interface InstrumentOptions {
  /** Where spans go. Default: the global one (`trace.setGlobalTracerProvider`, or what the Node SDK registers). */
  tracerProvider?: api.TracerProvider;
  /** Where metrics go. Default: the global one (`metrics.setGlobalMeterProvider`). */
  meterProvider?: api.MeterProvider;
}

/** What {@link instrument} registered. */
export interface Instrumentation {
  readonly telemetry: Telemetry;
  /** Exports buffered spans and metrics (the providers' `forceFlush`). Never rejects. */
  flush(): Promise<void>;
  /** Unregisters it: outlive records nothing again. */
  uninstall(): void;
}

const SYSTEM = 'outlive';
const NAME = 'outlive';

// Seconds, from a fast claim (ms) to a long task (minutes): OpenTelemetry's
// default boundaries are for milliseconds and would put every point in the first bucket.
const SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900];

/** A span context as a row stores it: the traceparent, then a newline and the tracestate if any. */
export function formatTraceContext(sc: api.SpanContext): string | null {
  if (!api.isSpanContextValid(sc)) return null;
  const parent = `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
  const state = sc.traceState?.serialize();
  return state && parent.length + 1 + state.length <= MAX_TRACE_CONTEXT ? `${parent}\n${state}` : parent;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** A row's trace context as a span context to link to; null for none or one not well formed. */
export function parseTraceContext(stored: string | null): api.SpanContext | null {
  if (!stored) return null;
  const nl = stored.indexOf('\n');
  const m = TRACEPARENT.exec(nl < 0 ? stored : stored.slice(0, nl));
  if (!m || m[1] === 'ff') return null;
  const sc: api.SpanContext = { traceId: m[2]!, spanId: m[3]!, traceFlags: parseInt(m[4]!, 16), isRemote: true };
  // createTraceState came in API 1.4; on an older API the link keeps its ids without the state.
  const create = (api as { createTraceState?: (raw?: string) => api.TraceState }).createTraceState;
  if (nl >= 0 && create) sc.traceState = create(stored.slice(nl + 1));
  return api.isSpanContextValid(sc) ? sc : null;
}

function recordError(span: api.Span, error: unknown): void {
  const err = error instanceof Error ? error : { name: 'Error', message: String(error) };
  span.recordException({ name: err.name, message: err.message, ...('stack' in err && err.stack ? { stack: err.stack } : {}) });
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: err.message });
}

async function forceFlush(provider: unknown): Promise<void> {
  // The global tracer provider is a proxy; the SDK's provider behind it has forceFlush.
  const p = provider as { getDelegate?: () => unknown; forceFlush?: () => Promise<unknown> };
  const target = (typeof p.getDelegate === 'function' ? p.getDelegate() : p) as { forceFlush?: () => Promise<unknown> };
  try {
    if (typeof target?.forceFlush === 'function') await target.forceFlush();
  } catch {
    // An exporter that failed says so through the SDK's diagnostics; a route never fails for it.
  }
}

/** Makes the {@link Telemetry} that records through OpenTelemetry, without registering it. */
export function openTelemetry(options: InstrumentOptions = {}): Telemetry {
  const tracerProvider = options.tracerProvider ?? api.trace.getTracerProvider();
  const meterProvider = options.meterProvider ?? api.metrics.getMeterProvider();
  const tracer = tracerProvider.getTracer(NAME);
  const meter = meterProvider.getMeter(NAME);
  // Metric attributes made once per task, queue and outcome, not per attempt,
  // with that set's count of attempts. No messaging.system: the meter's name says it.
  const attributeSets = new Map<string, { plain: api.Attributes; withOutcome: api.Attributes; count: number }>();
  const attributesOf = (r: AttemptRecord) => {
    const key = `${r.task}\n${r.queue}\n${r.outcome}`;
    let a = attributeSets.get(key);
    if (!a) {
      const plain = { 'messaging.destination.name': r.queue, 'outlive.task.name': r.task };
      a = { plain, withOutcome: { ...plain, 'outlive.outcome': r.outcome }, count: 0 };
      attributeSets.set(key, a);
    }
    return a;
  };
  // The API's no-op meter (no SDK registered) records nothing: a pass need not read what metrics would take.
  const noopMeter = (api as { createNoopMeter?: () => object }).createNoopMeter?.();
  const metering = !(noopMeter && meter instanceof noopMeter.constructor);
  const startLatency = meter.createHistogram('outlive.task.start_latency', {
    unit: 's',
    description: 'Time from when a task was due to its claim.',
    advice: { explicitBucketBoundaries: SECONDS },
  });
  const duration = meter.createHistogram('outlive.attempt.duration', {
    unit: 's',
    description: 'Time one attempt of a task ran, from its start to its outcome.',
    advice: { explicitBucketBoundaries: SECONDS },
  });
  // Counted here and observed at each collection: an increment per attempt
  // costs a field write, where the SDK's add() hashes the attributes each time.
  const attempts = meter.createObservableCounter('outlive.attempts', { unit: '{attempt}', description: 'Attempts finished, by outcome.' });
  attempts.addCallback((result) => {
    for (const a of attributeSets.values()) if (a.count > 0) result.observe(a.count, a.withOutcome);
  });
  const resumeLatency = meter.createHistogram('outlive.signal.resume_latency', {
    unit: 's',
    description: 'Time from a signal to the end of the wait it resumed.',
    advice: { explicitBucketBoundaries: SECONDS },
  });


  const startPass = (info: { owner: string; queues: readonly string[] | null }): PassSpan => {
    const attributes: api.Attributes = { 'messaging.system': SYSTEM, 'outlive.pass.owner': info.owner };
    if (info.queues) attributes['outlive.pass.queues'] = [...info.queues];
    const span = tracer.startSpan('outlive pass', { kind: api.SpanKind.INTERNAL, attributes }, api.context.active());
    const within = api.trace.setSpan(api.context.active(), span);
    return {
      recording: metering || span.isRecording(),
      startAttempt(a: AttemptInfo) {
        const attributes: api.Attributes = {
          'messaging.system': SYSTEM,
          'messaging.operation.type': 'process',
          'messaging.operation.name': 'process',
          'messaging.destination.name': a.queue,
          'messaging.message.id': a.id,
          'outlive.task.name': a.task,
          'outlive.attempt': a.attempt,
        };
        if (a.runId !== null) attributes['outlive.run.id'] = a.runId;
        if (a.limitKeys) attributes['outlive.limit.keys'] = [...a.limitKeys];
        if (a.step !== null) attributes['outlive.step.key'] = a.step;
        // At the start, so a sampler sees it; the claim returned it (migration 0021).
        const link = parseTraceContext(a.link);
        const span = tracer.startSpan(`process ${a.task}`, { kind: api.SpanKind.CONSUMER, attributes, ...(link ? { links: [{ context: link }] } : {}) }, within);
        const active = api.trace.setSpan(within, span);
        return {
          run: <T>(fn: () => T): T => api.context.with(active, fn),
          end(e: AttemptEnd) {
            span.setAttribute('outlive.outcome', e.outcome);
            if (e.detail.startLatencyMs !== null) span.setAttribute('outlive.start_latency_ms', e.detail.startLatencyMs);
            if (e.error) {
              span.recordException({ name: e.error.name, message: e.error.message, ...(e.error.stack ? { stack: e.error.stack } : {}) });
              span.setStatus({ code: api.SpanStatusCode.ERROR, message: e.error.message });
            }
            span.end(e.endTime);
          },
        };
      },
      startSettle(count: number) {
        const span = tracer.startSpan(
          'settle',
          {
            kind: api.SpanKind.CLIENT,
            attributes: { 'messaging.system': SYSTEM, 'messaging.operation.type': 'settle', 'messaging.operation.name': 'settle', 'messaging.batch.message_count': count },
          },
          within,
        );
        return {
          end(settled: number, error?: unknown) {
            span.setAttribute('outlive.settled', settled);
            if (error !== undefined) recordError(span, error);
            span.end();
          },
        };
      },
      startWaits(w: { count: number; keys: readonly string[] }) {
        const attributes: api.Attributes = {
          'messaging.system': SYSTEM,
          'messaging.operation.type': 'process',
          'messaging.operation.name': 'process',
          'messaging.batch.message_count': w.count,
        };
        // The first keys only: a storm of deadlines may begin 500 waits at once.
        if (w.keys.length > 0) attributes['outlive.wait.keys'] = w.keys.slice(0, 20);
        const waits = tracer.startSpan('process $wait', { kind: api.SpanKind.CONSUMER, attributes }, within);
        return {
          end(result: { parked: number; ended: number }, error?: unknown) {
            waits.setAttributes({ 'outlive.wait.parked': result.parked, 'outlive.wait.ended': result.ended });
            if (error !== undefined) recordError(waits, error);
            waits.end();
          },
        };
      },
      end(report, error) {
        span.setAttributes({ 'outlive.pass.claimed': report.claimed, 'outlive.pass.stopped_by': report.stoppedBy });
        if (error !== undefined) recordError(span, error);
        span.end();
      },
    };
  };

  return {
    startSend(info: SendInfo) {
      const attributes: api.Attributes = {
        'messaging.system': SYSTEM,
        'messaging.operation.type': 'send',
        'messaging.operation.name': 'send',
        'messaging.destination.name': info.queue,
      };
      if (info.run !== undefined) attributes['outlive.run.name'] = info.run;
      else attributes['outlive.task.name'] = info.task;
      if (info.count !== 1) attributes['messaging.batch.message_count'] = info.count;
      const span = tracer.startSpan(`send ${info.task}`, { kind: api.SpanKind.PRODUCER, attributes }, api.context.active());
      return {
        context: formatTraceContext(span.spanContext()),
        end(error?: unknown) {
          if (error !== undefined) recordError(span, error);
          span.end();
        },
      };
    },
    startPass,
    attemptFinished(r: AttemptRecord) {
      const a = attributesOf(r);
      a.count++;
      duration.record(r.durationMs / 1000, a.withOutcome);
      if (r.startLatencyMs !== null) startLatency.record(r.startLatencyMs / 1000, a.plain);
    },
    signalResumed(r: SignalRecord) {
      resumeLatency.record(r.latencyMs / 1000, { 'messaging.destination.name': r.queue });
    },
    async flush() {
      await Promise.all([forceFlush(tracerProvider), forceFlush(meterProvider)]);
    },
  };
}

/**
 * Registers outlive's OpenTelemetry instrumentation: from now on enqueues
 * store their trace context, passes and attempts are spans, and attempts
 * are metrics. Call it once at startup, after the SDK is set up; with no SDK
 * it records nothing (the API's no-op providers).
 *
 * ```ts
 * import { NodeSDK } from '@opentelemetry/sdk-node';
 * import { instrument } from 'outlive/otel';
 * new NodeSDK({ traceExporter }).start();
 * instrument();
 * ```
 *
 * The routes of `outlive/cloudflare` and `outlive/vercel` flush it in the
 * platform's `waitUntil`; a LISTEN worker's spans go out with the SDK's own
 * batching.
 */
export function instrument(options: InstrumentOptions = {}): Instrumentation {
  const t = openTelemetry(options);
  setTelemetry(t);
  return {
    telemetry: t,
    flush: () => t.flush(),
    uninstall() {
      if (telemetry() === t) setTelemetry(null);
    },
  };
}
