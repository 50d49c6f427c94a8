/**
 * graphile-worker 0.18 as the harness drives it, on Node 22, with the
 * performance settings its documentation gives (worker.graphile.org/docs/performance):
 * a local queue that fetches and locks jobs in batches, and batched
 * completion (`completeJobBatchDelay: 0`, `failJobBatchDelay: 0`).
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { Logger, makeWorkerUtils, run, runMigrations, type Runner, type WorkerUtils } from 'graphile-worker';
import type { Driver, Payload, WorkerSettings } from './protocol.ts';

/**
 * The worker's settings, reported in docs/benchmarks.md. The documented
 * performance preset uses `localQueue: { size: 500 }` and both batch delays
 * at 0; the pool follows the documented rule `max(10, concurrentJobs + 2)`.
 * Above a concurrency of 500 (the liveness phase's 1,000) the local queue
 * grows to the concurrency, as graphile-worker's own warning asks
 * (src/main.ts: a batch smaller than the concurrency), and the pool stays at
 * 12: the rule would allow more connections than the server has
 * (max_connections 100, shared), and the handlers never use the pool.
 */
export const GRAPHILE_SETTINGS = {
  localQueueSize: (concurrency: number) => Math.max(500, concurrency),
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
  pollInterval: 2_000,
  maxPoolSize: (concurrency: number) => Math.min(12, Math.max(10, concurrency + 2)),
} as const;

// Quiet, except for errors: a benchmark should not measure console output.
const logger = new Logger(() => (level, message) => {
  if (level === 'error') console.error(`graphile-worker: ${message}`);
});

/** Creates the graphile-worker driver. */
export function createDriver(): Driver {
  let url = '';
  let utils: WorkerUtils | null = null;
  let txPool: pg.Pool | null = null;
  let txClient: pg.PoolClient | null = null;
  let runner: Runner | null = null;

  return {
    name: 'graphile-worker',
    version: () => JSON.parse(readFileSync(new URL('../node_modules/graphile-worker/package.json', import.meta.url), 'utf8')).version,
    settings: (concurrency) =>
      `run({ concurrency: ${concurrency}, maxPoolSize: ${GRAPHILE_SETTINGS.maxPoolSize(concurrency)}, ` +
      `pollInterval: ${GRAPHILE_SETTINGS.pollInterval}, preset.worker: { localQueue: { size: ${GRAPHILE_SETTINGS.localQueueSize(concurrency)} }, ` +
      `completeJobBatchDelay: ${GRAPHILE_SETTINGS.completeJobBatchDelay}, failJobBatchDelay: ${GRAPHILE_SETTINGS.failJobBatchDelay} } }); ` +
      'prepared statements on (the default)',
    async install(target) {
      await runMigrations({ connectionString: target, logger });
    },
    async open(target) {
      url = target;
      utils = await makeWorkerUtils({ connectionString: url, logger });
      await utils.withPgClient((client) => client.query('SELECT 1'));
    },
    async enqueueOne(payload) {
      await utils!.addJob('noop', payload);
    },
    async enqueueOneInTransaction(payload) {
      // add_job is graphile-worker's SQL API for adding a job inside the
      // caller's transaction (what addJob calls through its own pool).
      txPool ??= new pg.Pool({ connectionString: url, max: 1 });
      txClient ??= await txPool.connect();
      await txClient.query('BEGIN');
      await txClient.query('SELECT graphile_worker.add_job($1, $2::json)', ['noop', JSON.stringify(payload)]);
      await txClient.query('COMMIT');
    },
    async enqueueMany(payloads) {
      await utils!.addJobs(payloads.map((payload) => ({ identifier: 'noop', payload })));
    },
    async startWorker(settings: WorkerSettings, runJob) {
      runner = await run({
        connectionString: url,
        concurrency: settings.concurrency,
        maxPoolSize: GRAPHILE_SETTINGS.maxPoolSize(settings.concurrency),
        pollInterval: GRAPHILE_SETTINGS.pollInterval,
        noHandleSignals: true,
        logger,
        taskList: {
          noop: async (payload) => {
            await runJob(payload as Payload);
          },
        },
        preset: {
          worker: {
            localQueue: { size: GRAPHILE_SETTINGS.localQueueSize(settings.concurrency) },
            completeJobBatchDelay: GRAPHILE_SETTINGS.completeJobBatchDelay,
            failJobBatchDelay: GRAPHILE_SETTINGS.failJobBatchDelay,
          },
        },
      });
    },
    async stopWorker() {
      await runner?.stop();
      runner = null;
    },
    async close() {
      txClient?.release();
      txClient = null;
      await txPool?.end();
      txPool = null;
      await utils?.release();
      utils = null;
    },
  };
}
