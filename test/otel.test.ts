/**
 * Traces and metrics through `outlive/otel`, read back from OpenTelemetry's
 * own SDK (in-memory exporters): an enqueue in a request span stores its
 * trace context in the row, in the caller's transaction; the attempt that
 * runs it is a `process` span of its pass, linked to that context; a run's
 * steps link to the run's; with nothing registered, nothing is stored and
 * nothing recorded; a route flushes what is buffered before it closes.
 */
import { context, trace, type Span } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, BatchSpanProcessor, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { build } from 'esbuild';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, enqueueMany, NonRetriableError, signal, sleepStep, startRun, step, tick, waitFor } from '../src/index.js';
import { instrument, parseTraceContext, formatTraceContext, type Instrumentation } from '../src/otel/index.js';
import { setTelemetry, telemetry } from '../src/model/telemetry.js';
import { createCronRoute } from '../src/http/vercel.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const contextManager = new AsyncLocalStorageContextManager();
beforeAll(() => {
  contextManager.enable();
  context.setGlobalContextManager(contextManager);
});
afterAll(() => {
  context.disable();
});

let installed: Instrumentation | null = null;
afterEach(async () => {
  installed?.uninstall();
  installed = null;
  await db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks');
});

/** Registers outlive's instrumentation on a fresh SDK whose spans and metrics land in memory. */
function traced(processor: 'simple' | 'batch' = 'simple') {
  const spans = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({
    // A batch processor whose delay never comes in a test: spans arrive only when flushed.
    spanProcessors: [processor === 'simple' ? new SimpleSpanProcessor(spans) : new BatchSpanProcessor(spans, { scheduledDelayMillis: 3_600_000 })],
  });
  const metrics = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter: metrics, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  installed = instrument({ tracerProvider, meterProvider });
  const tracer = tracerProvider.getTracer('app');
  return { spans, metrics, reader, tracer, installed };
}

/** Runs `fn` inside an active span of the app's, as a request handler would, and returns it. */
async function inSpan<T>(tracer: ReturnType<typeof traced>['tracer'], name: string, fn: (span: Span) => Promise<T>): Promise<{ span: Span; value: T }> {
  return tracer.startActiveSpan(name, async (span) => {
    try {
      return { span, value: await fn(span) };
    } finally {
      span.end();
    }
  });
}

const named = (spans: readonly ReadableSpan[], name: string) => spans.filter((s) => s.name === name);

const seen: string[] = [];
const greet = defineTask({
  name: 'otel.greet',
  input: z.object({ who: z.string() }),
  run: ({ who }) => {
    // The handler runs inside its attempt's span.
    seen.push(trace.getActiveSpan()?.spanContext().spanId ?? 'none');
    return { hello: who };
  },
});
const broken = defineTask({
  name: 'otel.broken',
  input: z.object({}),
  retry: { maxAttempts: 1 },
  run: () => {
    throw new NonRetriableError('nope');
  },
});

describe('outlive/otel', () => {
  it('links the attempt to the enqueue made in a request span: send, pass, process, settle, with the messaging attributes', async () => {
    const { spans, tracer } = traced();
    const { span: request, value: task } = await inSpan(tracer, 'POST /signup', async () => {
      const client = await db.pool.connect();
      try {
        await client.query('BEGIN');
        const t = await enqueue(client, greet, { who: 'ada' }, { queue: 'mail' });
        await client.query('COMMIT');
        return t;
      } finally {
        client.release();
      }
    });
    const [row] = await db.rows<{ trace_context: string }>('SELECT trace_context FROM outlive.tasks WHERE id = $1', [task.id]);
    const [send] = named(spans.getFinishedSpans(), 'send otel.greet');
    expect(send).toBeDefined();
    // The stored context is the send span's, in the request's trace.
    expect(row!.trace_context).toBe(formatTraceContext(send!.spanContext()));
    expect(send!.spanContext().traceId).toBe(request.spanContext().traceId);
    expect(send!.kind).toBe(3); // PRODUCER
    expect(send!.attributes).toMatchObject({ 'messaging.system': 'outlive', 'messaging.operation.type': 'send', 'messaging.destination.name': 'mail', 'outlive.task.name': 'otel.greet' });

    const { span: drain } = await inSpan(tracer, 'POST /drain', () => tick(db.pool, { tasks: [greet], budgetMs: 20_000 }));
    const finished = spans.getFinishedSpans();
    const [pass] = named(finished, 'outlive pass');
    const [process] = named(finished, 'process otel.greet');
    const [settle] = named(finished, 'settle');
    // The pass is a child of the drain's request span; the attempt a child of the pass, linked to the enqueue.
    expect(pass!.parentSpanContext?.spanId).toBe(drain.spanContext().spanId);
    expect(process!.parentSpanContext?.spanId).toBe(pass!.spanContext().spanId);
    expect(process!.spanContext().traceId).toBe(drain.spanContext().traceId);
    expect(process!.links.map((l) => l.context.spanId)).toEqual([send!.spanContext().spanId]);
    expect(process!.kind).toBe(4); // CONSUMER
    expect(process!.attributes).toMatchObject({
      'messaging.system': 'outlive',
      'messaging.operation.type': 'process',
      'messaging.destination.name': 'mail',
      'messaging.message.id': task.id,
      'outlive.task.name': 'otel.greet',
      'outlive.attempt': 1,
      'outlive.outcome': 'succeeded',
    });
    expect(seen.at(-1)).toBe(process!.spanContext().spanId);
    expect(settle!.parentSpanContext?.spanId).toBe(pass!.spanContext().spanId);
    expect(settle!.attributes).toMatchObject({ 'messaging.operation.type': 'settle', 'messaging.batch.message_count': 1, 'outlive.settled': 1 });
    expect(pass!.attributes).toMatchObject({ 'outlive.pass.claimed': 1, 'outlive.pass.stopped_by': 'drained' });
  });

  it('stores nothing of an enqueue rolled back, and writes one context for a batch', async () => {
    const { spans } = traced();
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await enqueue(client, greet, { who: 'gone' });
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    expect(await db.rows('SELECT 1 FROM outlive.tasks')).toEqual([]);
    const many = await enqueueMany(db.pool, greet, [{ who: 'a' }, { who: 'b' }, { who: 'c' }]);
    const rows = await db.rows<{ trace_context: string }>('SELECT DISTINCT trace_context FROM outlive.tasks WHERE id = ANY($1::bigint[])', [many.map((m) => m.id)]);
    expect(rows).toHaveLength(1);
    const batch = named(spans.getFinishedSpans(), 'send otel.greet').at(-1)!;
    expect(batch.attributes['messaging.batch.message_count']).toBe(3);
    expect(rows[0]!.trace_context).toBe(formatTraceContext(batch.spanContext()));
  });

  it('stores the context on every insert path: a governed task, and debounce through outlive.enqueue_keyed', async () => {
    const { spans } = traced();
    const limited = defineTask({ name: 'otel.limited', input: z.object({ n: z.number() }), limits: [{ key: 'otel-api', concurrency: 1 }], run: () => 1 });
    const governed = await enqueue(db.pool, limited, { n: 1 });
    const first = await enqueue(db.pool, greet, { who: 'first' }, { key: 'k', keyMode: 'replace', delayMs: 60_000 });
    const second = await enqueue(db.pool, greet, { who: 'second' }, { key: 'k', keyMode: 'replace', delayMs: 60_000 });
    expect(second).toMatchObject({ id: first.id, replaced: true });
    const sends = spans.getFinishedSpans().filter((s) => s.name.startsWith('send '));
    const contextOf = async (id: string) => (await db.rows<{ trace_context: string }>('SELECT trace_context FROM outlive.tasks WHERE id = $1', [id]))[0]!.trace_context;
    expect(await contextOf(governed.id)).toBe(formatTraceContext(sends[0]!.spanContext()));
    // The row rewritten by the second enqueue links to it, the latest.
    expect(await contextOf(first.id)).toBe(formatTraceContext(sends[2]!.spanContext()));
    // Its attempt links to it, with its limit keys.
    await tick(db.pool, { tasks: [limited], budgetMs: 20_000 });
    const [process] = named(spans.getFinishedSpans(), 'process otel.limited');
    expect(process!.attributes['outlive.limit.keys']).toEqual(['otel-api']);
    expect(process!.links.map((l) => l.context.spanId)).toEqual([sends[0]!.spanContext().spanId]);
  });

  it('records a failed attempt as an error on its span, and the attempts as metrics', async () => {
    const { spans, metrics, reader } = traced();
    await enqueue(db.pool, broken, {});
    await enqueue(db.pool, greet, { who: 'x' });
    await tick(db.pool, { tasks: [broken, greet], budgetMs: 20_000 });
    const [process] = named(spans.getFinishedSpans(), 'process otel.broken');
    expect(process!.status).toEqual({ code: 2, message: 'nope' });
    expect(process!.events.map((e) => e.name)).toEqual(['exception']);
    expect(process!.attributes['outlive.outcome']).toBe('failed');

    await reader.forceFlush();
    const exported = metrics.getMetrics().at(-1)!.scopeMetrics.flatMap((s) => s.metrics);
    const byName = new Map(exported.map((m) => [m.descriptor.name, m]));
    expect([...byName.keys()].sort()).toEqual(['outlive.attempt.duration', 'outlive.attempts', 'outlive.task.start_latency']);
    const attempts = byName.get('outlive.attempts')!.dataPoints.map((p) => [p.attributes['outlive.task.name'], p.attributes['outlive.outcome'], p.value]);
    expect(attempts).toEqual(expect.arrayContaining([['otel.broken', 'failed', 1], ['otel.greet', 'succeeded', 1]]));
    expect(byName.get('outlive.attempt.duration')!.descriptor.unit).toBe('s');
    expect(byName.get('outlive.task.start_latency')!.descriptor.unit).toBe('s');
  });

  it('links every step of a run, spawned ones too, to the run\'s send span', async () => {
    const { spans } = traced();
    const child = defineTask({ name: 'otel.child', input: z.object({}), run: () => 1 });
    const parent = defineTask({
      name: 'otel.parent',
      input: z.object({}),
      run: (_input, ctx) => {
        ctx.spawn('later', step(child, {}));
        return 0;
      },
    });
    await startRun(db.pool, 'otel-run', { first: step(parent, {}), second: step(child, {}, { after: ['first'] }) });
    const [send] = named(spans.getFinishedSpans(), 'send otel-run');
    expect(send!.attributes).toMatchObject({ 'outlive.run.name': 'otel-run', 'messaging.batch.message_count': 2 });
    await tick(db.pool, { tasks: [parent, child], budgetMs: 20_000 });
    const processes = spans.getFinishedSpans().filter((s) => s.name.startsWith('process '));
    expect(processes.map((p) => p.attributes['outlive.step.key']).sort()).toEqual(['first', 'later', 'second']);
    for (const p of processes) {
      expect(p.links.map((l) => l.context.spanId)).toEqual([send!.spanContext().spanId]);
      expect(p.attributes['outlive.run.id']).toBeDefined();
    }
  });

  it('flushes buffered spans when a route closes its invocation', async () => {
    const { spans, tracer } = traced('batch');
    await enqueue(db.pool, greet, { who: 'cron' });
    const CRON_SECRET = `cron-${crypto.randomUUID()}`;
    const handed: Promise<unknown>[] = [];
    const GET = createCronRoute(() => [greet], { env: { DATABASE_URL: db.url, CRON_SECRET }, write: () => undefined, waitUntil: (w) => void handed.push(w) });
    await inSpan(tracer, 'GET /api/cron', async () => {
      const res = await GET(new Request('https://app.example/api/cron', { headers: { authorization: `Bearer ${CRON_SECRET}` } }));
      expect(res.status).toBe(200);
    });
    await Promise.all(handed);
    // The batch processor's own delay is an hour: these came through the route's flush.
    expect(named(spans.getFinishedSpans(), 'process otel.greet')).toHaveLength(1);
  });

  it('with nothing registered, stores no context, records nothing and fails nothing', async () => {
    expect(telemetry()).toBeNull();
    const spans = new InMemorySpanExporter();
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
    // An app's spans around it do not make outlive record.
    await provider.getTracer('app').startActiveSpan('POST /x', async (span) => {
      await enqueue(db.pool, greet, { who: 'plain' });
      await tick(db.pool, { tasks: [greet], budgetMs: 20_000 });
      span.end();
    });
    expect(await db.rows('SELECT trace_context FROM outlive.tasks WHERE trace_context IS NOT NULL')).toEqual([]);
    expect(spans.getFinishedSpans().map((s) => s.name)).toEqual(['POST /x']);
  });

  it('with the API but no SDK behind it, stores NULL and runs as before', async () => {
    installed = instrument();
    const t = await enqueue(db.pool, greet, { who: 'noop' });
    const report = await tick(db.pool, { tasks: [greet], budgetMs: 20_000 });
    expect(report.succeeded).toBe(1);
    expect(await db.rows('SELECT trace_context FROM outlive.tasks WHERE id = $1', [t.id])).toEqual([{ trace_context: null }]);
  });

  it('records the waits a pass begins, with their keys', async () => {
    const { spans } = traced();
    await startRun(db.pool, 'otel-waits', { w: waitFor('otel-key', { timeoutMs: 60_000 }), nap: sleepStep({ ms: 60_000 }) });
    expect((await tick(db.pool, { tasks: [greet], budgetMs: 20_000 })).parked).toBe(2);
    const [waits] = named(spans.getFinishedSpans(), 'process $wait');
    expect(waits!.attributes).toMatchObject({ 'messaging.batch.message_count': 2, 'outlive.wait.keys': ['otel-key'], 'outlive.wait.parked': 2, 'outlive.wait.ended': 0 });
  });

  it('records the time from a signal that ended a wait to the start of the step after it, once', async () => {
    const { metrics, reader } = traced();
    await startRun(db.pool, 'otel-resume', { w: waitFor('otel-resume', { timeoutMs: 60_000 }), after: step(greet, { who: 'w' }, { after: ['w'] }) });
    expect((await tick(db.pool, { tasks: [greet], budgetMs: 20_000 })).parked).toBe(1);
    // A step after a wait that ended without its signal (its deadline) is not a resume by signal.
    await startRun(db.pool, 'otel-nap', { nap: sleepStep({ ms: 1 }), after: step(greet, { who: 'nap' }, { after: ['nap'] }) });
    expect(await signal(db.pool, 'otel-resume', { ok: true })).toMatchObject({ delivered: 1 });
    const greeted = async () =>
      (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE name = 'otel.greet' AND state = 'succeeded'`))[0]!.n;
    // The nap's deadline comes a millisecond after it parks: a few passes end it and run what follows.
    for (let i = 0; i < 10 && (await greeted()) < 2; i++) {
      await new Promise((r) => setTimeout(r, 10));
      await tick(db.pool, { tasks: [greet], budgetMs: 20_000 });
    }
    expect(await greeted()).toBe(2);

    await reader.forceFlush();
    const exported = metrics.getMetrics().at(-1)!.scopeMetrics.flatMap((s) => s.metrics);
    const resume = exported.find((m) => m.descriptor.name === 'outlive.signal.resume_latency')!;
    expect(resume.descriptor.unit).toBe('s');
    const points = resume.dataPoints as { attributes: Record<string, unknown>; value: { count: number; min?: number } }[];
    expect(points.map((p) => [p.attributes['messaging.destination.name'], p.value.count])).toEqual([['default', 1]]);
    expect(points[0]!.value.min).toBeGreaterThanOrEqual(0);
  });

  it('a pass outlives an observer that throws when an attempt ends', async () => {
    const { installed: otel } = traced();
    setTelemetry({ ...otel.telemetry, attemptFinished: () => { throw new Error('observer bug'); } });
    try {
      await enqueue(db.pool, greet, { who: 'x' });
      expect((await tick(db.pool, { tasks: [greet], budgetMs: 20_000 })).succeeded).toBe(1);
    } finally {
      setTelemetry(null);
    }
  });

  it('reads back what it stores, and refuses what is not a traceparent', () => {
    const sc = { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: 1 };
    const stored = formatTraceContext(sc)!;
    expect(stored).toBe('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
    expect(parseTraceContext(stored)).toMatchObject({ ...sc, isRemote: true });
    expect(parseTraceContext(`${stored}\nvendor=x`)?.traceState?.get('vendor')).toBe('x');
    for (const bad of ['', 'nonsense', 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', '00-00000000000000000000000000000000-b7ad6b7169203331-01']) {
      expect(parseTraceContext(bad)).toBeNull();
    }
  });

  it('refuses a trace context longer than the column allows', async () => {
    await expect(db.pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, trace_context) VALUES ('x', '{}', 1, 1000, repeat('a', 1025))`)).rejects.toThrow(
      /tasks_trace_context_check/,
    );
  });
});

describe('the core without @opentelemetry/api', () => {
  it('bundles every entry but outlive/otel for workerd with the API unresolvable', async () => {
    const entries = ['src/index.ts', 'src/http/cloudflare.ts', 'src/http/vercel.ts'].map((e) => path.join(root, e));
    const result = await build({
      entryPoints: entries,
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      conditions: ['workerd', 'worker', 'browser'],
      mainFields: ['module', 'main'],
      external: ['pg', 'node:*', 'cloudflare:*'],
      outdir: '/nonexistent',
      write: false,
      metafile: true,
      logLevel: 'silent',
      // As if the app never installed the API: any import of it fails the build.
      plugins: [{ name: 'no-otel', setup: (b) => b.onResolve({ filter: /^@opentelemetry\// }, (args) => ({ errors: [{ text: `${args.path} imported by ${args.importer}` }] })) }],
    });
    expect(result.errors).toEqual([]);
    expect(Object.keys(result.metafile.inputs).filter((i) => i.includes('opentelemetry'))).toEqual([]);
  });
});
