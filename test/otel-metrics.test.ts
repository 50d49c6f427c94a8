/**
 * The metrics snapshot as OpenTelemetry observable gauges, collected by the
 * real SDK (@opentelemetry/sdk-metrics) from a seeded database.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { MeterProvider, MetricReader, type GaugeMetricData } from '@opentelemetry/sdk-metrics';
import { observeQueues } from '../src/otel/metrics.js';
import { closePool, freshDb, openPool } from './support/db.js';

const db = await freshDb();

/** A reader that collects when asked, as a Prometheus exporter does on a scrape. */
class OnDemandReader extends MetricReader {
  protected async onShutdown(): Promise<void> {}
  protected async onForceFlush(): Promise<void> {}
}

const reader = new OnDemandReader();
const provider = new MeterProvider({ readers: [reader] });
afterAll(() => provider.shutdown());

/** Each gauge's points as `name{attrs}` → value. */
async function collect(): Promise<Map<string, number>> {
  const { resourceMetrics, errors } = await reader.collect();
  expect(errors).toEqual([]);
  const points = new Map<string, number>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const m of scope.metrics as GaugeMetricData[]) {
      for (const p of m.dataPoints) {
        const attrs = Object.entries(p.attributes).map(([k, v]) => `${k}=${v}`).sort().join(',');
        points.set(`${m.descriptor.name}{${attrs}}`, p.value);
      }
    }
  }
  return points;
}

describe('observeQueues', () => {
  it('reports depth, lag, pauses and limits as gauges, reading the rows at most once per interval', async () => {
    await db.pool.query(
      `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, run_at)
       VALUES ('job', 'mail', '{}', 3, 1000, pg_catalog.now() - interval '90 seconds'), ('job', 'mail', '{}', 3, 1000, pg_catalog.now() + interval '1 hour')`,
    );
    await db.pool.query(
      `INSERT INTO outlive.tasks (name, queue, state, input, attempts, max_attempts, timeout_ms, run_at, started_at, finished_at)
       VALUES ('job', 'mail', 'succeeded', '{}', 1, 3, 1000, pg_catalog.now() - interval '10 s', pg_catalog.now() - interval '8 s', pg_catalog.now() - interval '5 s')`,
    );
    await db.pool.query(`INSERT INTO outlive.queue_pauses (queue) VALUES ('mail')`);
    const errors: Error[] = [];
    const observer = observeQueues(provider.getMeter('test'), db.pool, { intervalMs: 60_000, onError: (e) => errors.push(e) });

    const first = await collect();
    expect(first.get('outlive.queue.depth{queue=mail,state=ready}')).toBe(1);
    expect(first.get('outlive.queue.depth{queue=mail,state=scheduled}')).toBe(1);
    expect(first.get('outlive.queue.depth{queue=mail,state=running}')).toBe(0);
    expect(first.get('outlive.queue.lag{queue=mail}')).toBeGreaterThanOrEqual(90);
    expect(first.get('outlive.queue.paused{queue=mail}')).toBe(1);
    expect(first.get('outlive.limit.blocked_tasks{queue=mail}')).toBe(0);
    expect(first.get('outlive.limit.keys_paused{}')).toBe(0);
    expect(first.get('outlive.recent.finished_tasks{queue=mail,state=succeeded}')).toBe(1);
    expect(first.get('outlive.recent.attempt_duration{quantile=0.5}')).toBe(3);
    expect(first.get('outlive.recent.start_latency{quantile=0.99}')).toBe(2);
    expect(first.has('outlive.recent.signal_to_resume{quantile=0.5}')).toBe(false);

    // Within the interval the snapshot is reported again, not read again.
    await db.pool.query(`DELETE FROM outlive.queue_pauses`);
    expect((await collect()).get('outlive.queue.paused{queue=mail}')).toBe(1);
    observer.stop();

    const fresh = observeQueues(provider.getMeter('test-fresh'), db.pool, { intervalMs: 0, onError: (e) => errors.push(e) });
    expect((await collect()).get('outlive.queue.paused{queue=mail}')).toBe(0);
    fresh.stop();
    expect(errors).toEqual([]);
  });

  it('tells onError of a failed read and reports nothing for it', async () => {
    const errors: Error[] = [];
    // A real pool on a port where nothing listens.
    const nowhere = openPool({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', connectionTimeoutMillis: 2000 });
    const observer = observeQueues(provider.getMeter('broken'), nowhere, { onError: (e) => errors.push(e) });
    const { resourceMetrics } = await reader.collect();
    expect(errors.map((e) => e.message)).toEqual([expect.stringMatching(/ECONNREFUSED/)]);
    const names = resourceMetrics.scopeMetrics.filter((s) => s.scope.name === 'broken').flatMap((s) => s.metrics.filter((m) => m.dataPoints.length > 0));
    expect(names).toEqual([]);
    observer.stop();
    await closePool(nowhere);
    expect(() => observeQueues(provider.getMeter('x'), db.pool, { intervalMs: -1 })).toThrow(/intervalMs/);
  });
});
