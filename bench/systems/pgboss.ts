/**
 * pg-boss 12 as the harness drives it, on Node 22: LISTEN/NOTIFY on (the
 * instance's `useListenNotify` and the queue's `notify`), and workers that
 * fetch and complete jobs in batches, fetching back to back while batches
 * come back full (`burstWhenBatchFull`).
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { PgBoss } from 'pg-boss';
import type { Driver, Payload, WorkerSettings } from './protocol.ts';

const QUEUE = 'noop';
/**
 * The worker's settings, reported in docs/benchmarks.md. pg-boss batches by
 * handing a handler an array: `localConcurrency` workers each fetch up to
 * `batchSize` jobs in one statement and complete them in one statement when
 * the handler returns. That is graphile-worker's local queue under another
 * name, so the two get the same treatment: up to 500 jobs fetched ahead per
 * process (graphile-worker's documented `localQueue.size`), and at most
 * `concurrency` handlers of a process running at once (a semaphore shared by
 * the process's workers). BENCH_PGBOSS_BATCH and BENCH_PGBOSS_WORKERS
 * override the two numbers, to compare. Measured here on a loaded machine
 * (drain of 100,000, one process, tasks/s): 2 x 10: 2,300; 2 x 100: 6,800;
 * 2 x 250: 8,400; 2 x 500: 10,000; 1 x 500: 10,700. (Batches of 1 cannot
 * burst: such a worker waits out its polling interval after every job.)
 */
export const PGBOSS_SETTINGS = {
  batchSize: Number(process.env.BENCH_PGBOSS_BATCH ?? 500),
  localConcurrency: Number(process.env.BENCH_PGBOSS_WORKERS ?? 1),
  burstWhenBatchFull: true,
  pollingIntervalSeconds: 2,
  notifyPollingIntervalSeconds: 30,
  useListenNotify: true,
  queueNotify: true,
  max: 12,
  /**
   * The liveness phase's jobs (those with `sleepMs`) are sent with
   * `heartbeatSeconds: 30`: the worker refreshes their `heartbeat_on` every
   * 15 s (heartbeatSeconds / 2), and the supervisor (every 60 s,
   * superviseIntervalSeconds) fails, and so retries, a job whose heartbeat is
   * older than 30 s. Without it only `expireInSeconds` (default 900)
   * bounds an active job. 30 s makes its promise comparable with outlive's
   * lease of 35 s.
   */
  longJobHeartbeatSeconds: 30,
} as const;

/**
 * Workers per process: enough batches that the process holds `concurrency`
 * jobs at once (a batch's worker fetches nothing more until its whole batch
 * is done): 1 at the usual 10, 2 of 500 at the liveness phase's 1,000.
 */
export const pgbossWorkers = (concurrency: number) => Math.max(PGBOSS_SETTINGS.localConcurrency, Math.ceil(concurrency / PGBOSS_SETTINGS.batchSize));

/** At most `limit` calls of `fn` at once, across every caller that shares it. */
function semaphore(limit: number): <T>(fn: () => Promise<T> | T) => Promise<T> {
  let active = 0;
  const waiting: (() => void)[] = [];
  return async (fn) => {
    if (active >= limit) await new Promise<void>((resolve) => waiting.push(resolve));
    active++;
    try {
      return await fn();
    } finally {
      active--;
      waiting.shift()?.();
    }
  };
}

/** Creates the pg-boss driver. */
export function createDriver(): Driver {
  let url = '';
  let boss: PgBoss | null = null;
  let txPool: pg.Pool | null = null;
  let txClient: pg.PoolClient | null = null;
  let working = false;

  return {
    name: 'pg-boss',
    version: () => JSON.parse(readFileSync(new URL('../node_modules/pg-boss/package.json', import.meta.url), 'utf8')).version,
    settings: (concurrency) =>
      `new PgBoss({ useListenNotify: true, max: ${PGBOSS_SETTINGS.max} }); createQueue('noop', { notify: true }); ` +
      `work('noop', { batchSize: ${PGBOSS_SETTINGS.batchSize}, localConcurrency: ${pgbossWorkers(concurrency)}, ` +
      `burstWhenBatchFull: true, pollingIntervalSeconds: ${PGBOSS_SETTINGS.pollingIntervalSeconds}, ` +
      `notifyPollingIntervalSeconds: ${PGBOSS_SETTINGS.notifyPollingIntervalSeconds} }), the batch's jobs run at most ${concurrency} at once per process; ` +
      'maintenance on (the defaults)',
    async install(target) {
      const b = new PgBoss({ connectionString: target, supervise: false, schedule: false });
      b.on('error', (err) => console.error('pg-boss:', err));
      await b.start();
      await b.createQueue(QUEUE, { notify: PGBOSS_SETTINGS.queueNotify });
      await b.stop({ graceful: true });
    },
    async open(target) {
      url = target;
      boss = new PgBoss({ connectionString: url, useListenNotify: PGBOSS_SETTINGS.useListenNotify, max: PGBOSS_SETTINGS.max });
      boss.on('error', (err) => console.error('pg-boss:', err));
      await boss.start();
    },
    async enqueueOne(payload) {
      await boss!.send(QUEUE, payload);
    },
    async enqueueOneInTransaction(payload) {
      // send() takes the caller's transaction as `db`, an object with executeSql.
      txPool ??= new pg.Pool({ connectionString: url, max: 1 });
      const client = (txClient ??= await txPool.connect());
      await client.query('BEGIN');
      await boss!.send(QUEUE, payload, { db: { executeSql: (text, values) => client.query(text, values) } });
      await client.query('COMMIT');
    },
    async enqueueMany(payloads) {
      await boss!.insert(
        QUEUE,
        payloads.map((data) => (data.sleepMs ? { data, heartbeatSeconds: PGBOSS_SETTINGS.longJobHeartbeatSeconds } : { data })),
      );
    },
    async startWorker(settings: WorkerSettings, run) {
      working = true;
      const slot = semaphore(settings.concurrency);
      await boss!.work<Payload>(
        QUEUE,
        {
          batchSize: PGBOSS_SETTINGS.batchSize,
          localConcurrency: pgbossWorkers(settings.concurrency),
          burstWhenBatchFull: PGBOSS_SETTINGS.burstWhenBatchFull,
          pollingIntervalSeconds: PGBOSS_SETTINGS.pollingIntervalSeconds,
          notifyPollingIntervalSeconds: PGBOSS_SETTINGS.notifyPollingIntervalSeconds,
        },
        async (jobs) => {
          await Promise.all(jobs.map((job) => slot(() => run(job.data))));
        },
      );
    },
    async stopWorker() {
      if (working) await boss?.offWork(QUEUE, { wait: true });
      working = false;
    },
    async close() {
      txClient?.release();
      txClient = null;
      await txPool?.end();
      txPool = null;
      await boss?.stop({ graceful: true });
      boss = null;
    },
  };
}
