/**
 * One chaos process: `node --import tsx chaos/child.ts worker|tick URL NAME`.
 *
 * - `worker`: a LISTEN worker (createWorker) firing the schedules on its clock.
 * - `tick`: a serverless-style loop: enqueueDue, then one bounded tick pass,
 *   as a cron route would do, over and over.
 *
 * It runs until it is killed. Every pass's report goes to stdout as one JSON
 * line, so the orchestrator can count lost leases and recoveries. Database
 * errors are expected (the chaos cuts connections and restarts the server):
 * they are counted, never fatal. Anything that does kill the process is an
 * unexpected exit, which the orchestrator reports as a finding.
 */
import pg from 'pg';
import { enqueueDue, tick, type TickReport } from '../src/index.js';
import { createWorker } from '../src/node/index.js';
import { chaosTasks } from './lib/tasks.js';

const [kind, url, name] = process.argv.slice(2);
if (!url || (kind !== 'worker' && kind !== 'tick')) {
  console.error('usage: child.ts worker|tick URL NAME');
  process.exit(2);
}

const report = (r: Partial<TickReport> & { errors?: number }) =>
  process.stdout.write(
    JSON.stringify({ name, claimed: r.claimed ?? 0, succeeded: r.succeeded ?? 0, lostLeases: r.lostLeases ?? 0, recovered: r.recovered ?? 0, errors: r.errors ?? 0 }) + '\n',
  );

// The handlers' own pool: their side effects go through the same route (proxy or not) as the engine.
const effectsPool = new pg.Pool({ connectionString: url, max: 16, application_name: `chaos-${name}` });
effectsPool.on('error', () => {});
const { all, schedules } = chaosTasks(effectsPool);

if (kind === 'worker') {
  const pool = new pg.Pool({ connectionString: url, max: 20, application_name: `chaos-${name}` });
  pool.on('error', () => {});
  const worker = createWorker({
    pool,
    tasks: all,
    schedules,
    concurrency: 16,
    pollIntervalMs: 250,
    // Passes end (and report) every few seconds rather than every 5 minutes.
    budgetMs: 6_000,
    scheduleIntervalMs: 500,
    retention: false,
    owner: `w-${name}`,
    applicationName: `chaos-${name}-listen`,
    reconnect: { baseMs: 50, maxMs: 1_000 },
    logger: { info: () => {}, warn: () => {}, error: () => report({ errors: 1 }) },
    onPass: (r) => report(r),
  });
  // The first connection may race a restart of the server: try until it is up.
  for (;;) {
    try {
      await worker.start();
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 200));
    }
  }
} else {
  const pool = new pg.Pool({ connectionString: url, max: 20, application_name: `chaos-${name}` });
  pool.on('error', () => {});
  for (;;) {
    try {
      await enqueueDue(pool, schedules);
    } catch {
      report({ errors: 1 });
    }
    try {
      const r = await tick(pool, { tasks: all, budgetMs: 4_000, concurrency: 16, leaseGraceMs: 500, leaseCheckMs: 300, owner: `t-${name}` });
      report(r);
      if (r.claimed === 0) await new Promise((res) => setTimeout(res, 100));
    } catch (err) {
      const partial = (err as { report?: TickReport }).report;
      report({ ...partial, errors: 1 });
      await new Promise((res) => setTimeout(res, 100));
    }
  }
}
