/**
 * pg-boss 12's side of the over-admission phase (lib/flow.ts): its
 * `groupConcurrency`, the per-group limit it enforces across every worker
 * "globally across all nodes (database tracking)" (types.d.ts of pg-boss
 * 12.38), on the same load as outlive's: group k1 limited to 1 and group k5
 * (tier `five`) to 5, jobs holding 0-50 ms at random, each handler writing
 * its start and end to benchflow_events.
 *
 * What pg-boss does (dist/plans.js, fetchNextJob): the fetch counts the
 * group's active jobs in the same statement that claims (a CTE reading
 * `state = 'active'` rows of the group, then FOR UPDATE SKIP LOCKED on the
 * candidates), without a lock on the group: two fetches that run at once can
 * each see the same count.
 *
 * Runs on Node 22 without a build: erasable TypeScript only.
 */
import pg from 'pg';
import { PgBoss } from 'pg-boss';
import { epochMs } from './protocol.ts';

const QUEUE = 'flow';

/** The settings reported in docs/benchmarks.md. */
export const PGBOSS_FLOW = {
  /** Jobs fetched per fetch: one, so the group limit is checked for each job. */
  batchSize: 1,
  pollingIntervalSeconds: 0.5,
  /** Each job is sent with this heartbeat, and the supervisor runs this often: a dead worker's job is failed (and retried) 10-15 s after its last heartbeat. */
  heartbeatSeconds: 10,
  superviseIntervalSeconds: 5,
  retryLimit: 10,
  max: 4,
  groupConcurrency: { default: 1, tiers: { five: 5 } },
};

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

let boss: PgBoss | null = null;
let events: pg.Pool | null = null;
let working = false;

function must<T>(value: T | null, what: string): T {
  if (value === null) throw new Error(`flow-pgboss: ${what} first`);
  return value;
}

/** The flow ops a pg-boss process answers (child.ts, op `flow`). */
export const flowOps: Record<string, (args: Record<string, unknown>) => Promise<unknown>> = {
  async open(args) {
    const url = args.url as string;
    boss = new PgBoss({
      connectionString: url,
      max: PGBOSS_FLOW.max,
      useListenNotify: true,
      superviseIntervalSeconds: PGBOSS_FLOW.superviseIntervalSeconds,
    });
    boss.on('error', (err) => console.error('pg-boss:', err));
    await boss.start();
    if (args.events) {
      events = new pg.Pool({ connectionString: url, max: 2, application_name: 'benchflow-pgboss-events' });
      events.on('error', (err) => console.warn(`pg-boss events pool: ${err.message}`));
      await events.query('SELECT 1');
    }
  },
  async enqueueAdmission(args) {
    const b = must(boss, 'open');
    await b.createQueue(QUEUE);
    const job = (i: number, group: { id: string; tier?: string }) => ({
      data: { i },
      group,
      heartbeatSeconds: PGBOSS_FLOW.heartbeatSeconds,
      retryLimit: PGBOSS_FLOW.retryLimit,
    });
    const jobs = [
      ...Array.from({ length: Number(args.k1) }, (_, i) => job(i, { id: 'k1' })),
      ...Array.from({ length: Number(args.k5) }, (_, i) => job(i, { id: 'k5', tier: 'five' })),
    ];
    for (let k = 0; k < jobs.length; k += 10_000) await b.insert(QUEUE, jobs.slice(k, k + 10_000));
  },
  async startAdmission(args) {
    const b = must(boss, 'open');
    const ev = must(events, 'open with events');
    const proc = Number(args.proc);
    working = true;
    await b.work<{ i: number }>(
      QUEUE,
      {
        batchSize: PGBOSS_FLOW.batchSize,
        localConcurrency: Number(args.concurrency),
        pollingIntervalSeconds: PGBOSS_FLOW.pollingIntervalSeconds,
        groupConcurrency: PGBOSS_FLOW.groupConcurrency,
      },
      async (jobs) => {
        for (const job of jobs) {
          const key = job.groupId ?? '?';
          const started = epochMs();
          await ev.query('INSERT INTO benchflow_events (id, attempt, key, proc, started) VALUES ($1, $2, $3, $4, $5)', [job.id, job.retryCount, key, proc, started]);
          await sleep(Math.random() * 50);
          const ended = epochMs();
          await ev.query('UPDATE benchflow_events SET ended = $1 WHERE id = $2 AND attempt = $3 AND proc = $4', [ended, job.id, job.retryCount, proc]);
        }
      },
    );
  },
  async stopWorker() {
    if (working) await boss?.offWork(QUEUE, { wait: true });
    working = false;
    return {};
  },
  async close() {
    await events?.end();
    events = null;
    await boss?.stop({ graceful: true });
    boss = null;
  },
};
