/**
 * What tracing costs a drain: passes over N plain tasks (no-op, one query
 * each, or a 10 ms wait each), timed with no telemetry registered, with outlive/otel over
 * the API's no-op providers (no SDK), and with an SDK exporting every span
 * through a BatchSpanProcessor to an exporter in memory (and metrics to a
 * reader). Throughput, and the process's CPU per task. Rounds are
 * interleaved, the order of the three rotating, so drift on a shared
 * machine falls on all of them alike; the medians go in docs/benchmarks.md
 * ("Tracing: what outlive/otel costs a drain").
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run measure:tracing -- [tasks] [rounds] [noop|query|sleep]
 *
 * It creates a scratch database beside DATABASE_URL's and drops it after.
 */
import pg from 'pg';
import { z } from 'zod';
import { context } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type ReadableSpan,
  type SpanExporter,
} from '@opentelemetry/sdk-trace-base';
import { defineTask, enqueueMany, tick } from '../src/index.js';
import { migrate } from '../src/node/index.js';
import { instrument, type Instrumentation } from '../src/otel/index.js';
import { scratchDatabase } from './local/scratch-db.js';

// On request (MODES=none,traces,metrics,sampled): the exporter's two halves
// alone, and the exporter with 1 pass in 10 sampled (a production setting).
type Mode = 'none' | 'noop' | 'exporter' | 'traces' | 'metrics' | 'sampled';
const MODES: Mode[] = process.env.MODES ? (process.env.MODES.split(',') as Mode[]) : ['none', 'noop', 'exporter'];

/**
 * What each task does: nothing (the drain's own cost, the worst case for any
 * overhead per task), one query (as a handler that writes something), or
 * waits 10 ms (a call to another service).
 */
type Work = 'noop' | 'query' | 'sleep';
const WORK: Work = process.argv[4] === 'query' || process.argv[4] === 'sleep' ? process.argv[4] : 'noop';
const RUN = {
  noop: () => undefined,
  query: async () => void (await appPool!.query('SELECT 1')),
  sleep: () => new Promise<void>((resolve) => setTimeout(resolve, 10)),
}[WORK];
let appPool: pg.Pool | null = null;
const noop = defineTask({
  name: 'measure.noop',
  input: z.object({ n: z.number() }),
  run: RUN,
});

/**
 * An exporter that counts the spans it is given and keeps none: the SDK's
 * InMemorySpanExporter keeps every span, and 20,000 kept spans a round cost
 * the garbage collector more than the spans themselves, which a real
 * exporter (serialising and sending) would not.
 */
class DiscardingExporter implements SpanExporter {
  count = 0;
  export(spans: ReadableSpan[], done: (result: { code: number }) => void): void {
    this.count += spans.length;
    done({ code: 0 });
  }
  async shutdown(): Promise<void> {}
  async forceFlush(): Promise<void> {}
}

/** Registers the mode's telemetry; returns how to count what it exported and to take it down. */
function register(mode: Mode): { exported(): number; flush(): Promise<void>; stop(): Promise<void> } {
  if (mode === 'none') return { exported: () => 0, flush: async () => undefined, stop: async () => undefined };
  if (mode === 'noop') {
    const i = instrument();
    return { exported: () => 0, flush: () => i.flush(), stop: async () => i.uninstall() };
  }
  const spans = new DiscardingExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [new BatchSpanProcessor(spans)],
    ...(mode === 'sampled' ? { sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(0.1) }) } : {}),
  });
  const reader = new PeriodicExportingMetricReader({ exporter: new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE), exportIntervalMillis: 60_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  // As the Node SDK sets up: handlers run in their attempt's context through AsyncLocalStorage.
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  const i: Instrumentation = instrument({
    ...(mode === 'metrics' ? {} : { tracerProvider }),
    ...(mode === 'traces' ? {} : { meterProvider }),
  });
  return {
    exported: () => spans.count,
    flush: () => i.flush(),
    stop: async () => {
      i.uninstall();
      context.disable();
      await tracerProvider.shutdown();
      await meterProvider.shutdown();
    },
  };
}

async function round(pool: pg.Pool, mode: Mode, tasks: number): Promise<{ perSecond: number; cpuUs: number; spans: number }> {
  const t = register(mode);
  try {
    // Enqueued under the mode, so the traced rounds' rows carry contexts to link to.
    for (let i = 0; i < tasks; i += 10_000) {
      await enqueueMany(pool, noop, Array.from({ length: Math.min(10_000, tasks - i) }, (_, k) => ({ n: i + k })));
    }
    await pool.query('VACUUM ANALYZE outlive.tasks');
    const started = performance.now();
    const cpu = process.cpuUsage();
    let done = 0;
    while (done < tasks) {
      const report = await tick(pool, { tasks: [noop], budgetMs: 600_000, concurrency: 10 });
      if (report.claimed === 0) throw new Error(`${mode}: the pass claimed nothing with ${tasks - done} tasks left`);
      done += report.claimed;
    }
    const seconds = (performance.now() - started) / 1000;
    // The exporter's work is part of the cost: flushed inside the CPU count, outside the time.
    await t.flush();
    const used = process.cpuUsage(cpu);
    const spans = t.exported();
    await t.stop();
    return { perSecond: tasks / seconds, cpuUs: (used.user + used.system) / tasks, spans };
  } catch (err) {
    await t.stop();
    throw err;
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function main(): Promise<void> {
  const tasks = Number(process.argv[2] ?? 20_000);
  const rounds = Number(process.argv[3] ?? 5);
  const scratch = await scratchDatabase('outlive_tracing');
  const pool = new pg.Pool({ connectionString: scratch.url, max: 4 });
  appPool = new pg.Pool({ connectionString: scratch.url, max: 10 });
  // Dropping the scratch database ends their connections; that is no news.
  pool.on('error', () => undefined);
  appPool.on('error', () => undefined);
  try {
    await migrate(scratch.url);
    // A warm-up round each, not counted: the JIT, the pool, the plans.
    for (const mode of MODES) await round(pool, mode, Math.min(tasks, 2_000));
    const results: Record<Mode, number[]> = { none: [], noop: [], exporter: [], traces: [], metrics: [], sampled: [] };
    const cpus: Record<Mode, number[]> = { none: [], noop: [], exporter: [], traces: [], metrics: [], sampled: [] };
    for (let r = 0; r < rounds; r++) {
      const order = MODES.map((_, i) => MODES[(i + r) % MODES.length]!);
      for (const mode of order) {
        const { perSecond, cpuUs, spans } = await round(pool, mode, tasks);
        results[mode].push(perSecond);
        cpus[mode].push(cpuUs);
        console.log(`round ${r + 1} ${mode.padEnd(8)} ${perSecond.toFixed(0)} tasks/s, ${cpuUs.toFixed(1)} µs CPU/task${spans > 0 ? ` (${spans} spans exported)` : ''}`);
      }
    }
    const base = median(results.none);
    console.log(`\n${tasks} tasks (${{ noop: 'no-op', query: 'one SELECT 1 each', sleep: '10 ms wait each' }[WORK]}) per round, ${rounds} rounds, medians:`);
    for (const mode of MODES) {
      const m = median(results[mode]);
      const range = `${Math.min(...results[mode]).toFixed(0)}-${Math.max(...results[mode]).toFixed(0)}`;
      const c = median(cpus[mode]);
      console.log(
        `${mode.padEnd(8)} ${m.toFixed(0)} tasks/s (range ${range}), ${(((base - m) / base) * 100).toFixed(1)} % below none; ` +
          `${c.toFixed(1)} µs of the process's CPU per task, ${(((c - median(cpus.none)) / median(cpus.none)) * 100).toFixed(1)} % above none`,
      );
    }
  } finally {
    await pool.end();
    await appPool.end();
    await scratch.drop();
  }
}

await main();
