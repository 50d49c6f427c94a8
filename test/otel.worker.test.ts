/**
 * outlive/otel in workerd: a Worker (node-postgres through Hyperdrive, so
 * with `nodejs_compat`, which the SDK's `node:util` import needs) whose
 * tasks module sets up an OpenTelemetry SDK, run in Miniflare. A task
 * enqueued by a traced app in Node runs on the Worker's cron event; the
 * attempt's span links to the enqueue across the row, and reaches the
 * exporter through the flush the invocation runs in `ctx.waitUntil` (the
 * batch processor's own delay is an hour).
 */
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { afterAll, describe, expect, it } from 'vitest';
import { enqueue } from '../src/write/enqueue.js';
import { instrument } from '../src/otel/index.js';
import { freshDb } from './support/db.js';
import { roleUrl } from './support/functions-db.js';
import { bundleWorker, startWorker, workerDatabase } from './support/worker.js';
import { traced } from './fixtures/otel-worker-tasks.js';

const db = await freshDb();
const { url } = await roleUrl(db);
const database = await workerDatabase('hyperdrive', url);
afterAll(() => database.close());

describe('outlive/otel in a Worker', () => {
  it('exports the attempt, linked to its enqueue, within the cron event', async () => {
    const script = await bundleWorker('test/fixtures/otel-worker-tasks.ts', database.entry);
    const spans = new InMemorySpanExporter();
    const app = instrument({ tracerProvider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }) });
    try {
      await enqueue(db.pool, traced, { n: 1 });
    } finally {
      app.uninstall();
    }
    expect(spans.getFinishedSpans().map((s) => s.name)).toEqual(['send otel-worker.traced']);
    const worker = await startWorker(script, database.bindings, database.options);
    try {
      expect((await worker.scheduled()).outcome, worker.output()).toBe('ok');
      const lines = worker.output().split('\n').filter((l) => l.includes('otel-span '));
      expect(lines.map((l) => l.slice(l.indexOf('otel-span ')))).toEqual(
        expect.arrayContaining(['otel-span process otel-worker.traced 1 succeeded', 'otel-span outlive pass 0 ']),
      );
    } finally {
      await worker.dispose();
    }
  });
});
