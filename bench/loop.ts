/**
 * `npx tsx loop.ts [--clients K] [--batch B] [--tasks N] [--others M] [--rounds R] [--settle keep|drop]`
 *
 * A closer look than the harness's phases: K connections run outlive's claim
 * and settle statements (CLAIM_SQL, SUCCEED_SQL) back to back over N pending
 * tasks, B at a time, with no worker, no handler and no Node.js work in
 * between, and the Postgres CPU of each statement is read from
 * /proc/<pid>/schedstat of its backend just before and after it. `--others M`
 * leaves M rows running under another lease owner for the whole loop, as the
 * prefetched rows of other workers would be. `--settle drop` settles with
 * DROP_SQL (the delete of a task defined with keepSucceeded: false) instead
 * of SUCCEED_SQL. Prints, per round: tasks/s,
 * Postgres CPU per 1,000 tasks split into claim and settle, and index entries
 * read per claim and per settle (pg_stat_user_indexes).
 *
 * Each round runs on a fresh database from a migrated template, on the
 * harness's server (BENCH_DATABASE_URL, or 127.0.0.1:5432). Run variants
 * side by side, round after round: this machine's noise between runs
 * (±15%) is larger than most effects worth measuring.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { CLAIM_SQL } from '../src/claim.ts';
import { migrate } from '../src/migrate.ts';
import { DROP_SQL, SUCCEED_SQL } from '../src/settle.ts';
import { Admin, urlFor } from './lib/postgres.ts';

const { values } = parseArgs({
  options: {
    clients: { type: 'string', default: '1' },
    batch: { type: 'string', default: '500' },
    tasks: { type: 'string', default: '100000' },
    others: { type: 'string', default: '0' },
    rounds: { type: 'string', default: '1' },
    settle: { type: 'string', default: 'keep' },
  },
});
const clients = Number(values.clients);
const batch = Number(values.batch);
const tasks = Number(values.tasks);
const others = Number(values.others);
const rounds = Number(values.rounds);
if (values.settle !== 'keep' && values.settle !== 'drop') throw new Error(`--settle is keep or drop, not ${values.settle}`);
const drop = values.settle === 'drop';

const TEMPLATE = 'bench_loop_tpl';
const DB = 'bench_loop';
const admin = await Admin.connect();
await admin.recreate(TEMPLATE);
await migrate(urlFor(TEMPLATE));

/** CPU time a backend has used so far, in nanoseconds. */
const cpuNs = (pid: number) => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);

for (let round = 1; round <= rounds; round++) {
  await admin.recreate(DB, TEMPLATE);
  const url = urlFor(DB);
  const setup = new pg.Client({ connectionString: url });
  await setup.connect();
  await setup.query(
    `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms)
     SELECT 'noop', jsonb_build_object('i', g), 3, 30000 FROM generate_series(1, $1::int) g`,
    [tasks + others],
  );
  await setup.query(
    `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'others',
            lease_expires_at = now() + interval '1 hour', started_at = now()
     WHERE id IN (SELECT id FROM outlive.tasks ORDER BY id LIMIT $1)`,
    [others],
  );
  await setup.query('VACUUM ANALYZE outlive.tasks');
  await setup.query('SELECT pg_stat_reset()');

  const conns = await Promise.all(
    Array.from({ length: clients }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      return { client, pid: rows[0]!.pid };
    }),
  );
  let claimNs = 0;
  let settleNs = 0;
  let claims = 0;
  let settles = 0;
  let settled = 0;
  const started = performance.now();
  await Promise.all(
    conns.map(async ({ client, pid }, k) => {
      const owner = `loop:${k}`;
      for (;;) {
        let before = cpuNs(pid);
        // Unnamed, as the worker sends it (src/claim.ts): planned every time.
        const { rows } = await client.query<{ id: string }>(CLAIM_SQL, [null, 30_000, null, batch, owner, 5_000, 30_000]);
        claimNs += cpuNs(pid) - before;
        claims++;
        if (rows.length === 0) return;
        before = cpuNs(pid);
        const ids = rows.map((r) => r.id);
        const done = drop
          ? await client.query({ name: 'drop', text: DROP_SQL, values: [ids, owner] })
          : await client.query({ name: 'succeed', text: SUCCEED_SQL, values: [null, ids, ids.map(() => null), owner] });
        settleNs += cpuNs(pid) - before;
        settles++;
        settled += done.rowCount ?? 0;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  for (const { client } of conns) await client.end();

  // Statistics reach the views within a second of the backends going idle.
  await new Promise((r) => setTimeout(r, 1_000));
  const { rows: indexes } = await setup.query<{ index: string; read: number }>(
    `SELECT indexrelname AS index, idx_tup_read::float8 AS read FROM pg_stat_user_indexes
     WHERE schemaname = 'outlive' AND relname = 'tasks' AND idx_tup_read > 0 ORDER BY 1`,
  );
  const { rows: check } = await setup.query<{ twice: number; left: number }>(
    `SELECT count(*) FILTER (WHERE attempts > 1)::int AS twice,
            count(*) FILTER (WHERE state <> 'succeeded' AND lease_owner IS DISTINCT FROM 'others')::int AS left
     FROM outlive.tasks`,
  );
  await setup.end();
  if (settled !== tasks || check[0]!.twice !== 0 || check[0]!.left !== 0) {
    throw new Error(`round ${round}: settled ${settled} of ${tasks}, ${check[0]!.twice} claimed twice, ${check[0]!.left} left`);
  }
  const perK = (ns: number) => ((ns / 1e6) * 1000) / tasks;
  console.log(
    `round ${round}: ${clients} client(s), batches of ${batch}, ${others} other running rows, successes ${drop ? 'deleted' : 'kept'}: ` +
      `${Math.round(tasks / seconds).toLocaleString('en-US')} tasks/s; Postgres CPU per 1,000 tasks ` +
      `claim ${perK(claimNs).toFixed(1)} + settle ${perK(settleNs).toFixed(1)} = ${perK(claimNs + settleNs).toFixed(1)} ms; ` +
      `index entries read per claim and settle: ${indexes.map((i) => `${i.index} ${Math.round(i.read / (i.index === 'tasks_claim_idx' ? claims : settles))}`).join(', ')}`,
  );
}
await admin.drop(DB);
await admin.drop(TEMPLATE);
await admin.close();
