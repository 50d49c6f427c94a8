/**
 * `npx tsx loop.ts [--clients K] [--batch B] [--tasks N] [--others M] [--rounds R] [--settle keep|drop|history] [--names K] [--unknown U] [--statements named|unnamed] [--pooler] [--template-sql SQL] [--db NAME]`
 *
 * A closer look than the harness's phases: K connections run outlive's claim
 * and settle statements (outlive.claim, SUCCEED_SQL) back to back over N pending
 * tasks, B at a time, with no worker, no handler and no Node.js work in
 * between, and the Postgres CPU of each statement is read from
 * /proc/<pid>/schedstat of its backend just before and after it. `--others M`
 * leaves M rows running under another lease owner for the whole loop, as the
 * prefetched rows of other workers would be. `--settle drop` settles with
 * DROP_SQL (the delete of a task defined with keepSucceeded: false) instead
 * of SUCCEED_SQL. `--settle history` measures a design outlive does not have:
 * the settle deletes the row and inserts what the dashboard would show of it
 * into a table of finished tasks of its own (HISTORY_SQL below, on a table
 * this script adds to its template), the way to keep history that writes
 * the least. `--names K` claims as a pass given K task names would (the
 * tasks' own and K-1 others); `--unknown U` puts U ready rows of a name no
 * pass knows ahead of the others in claim order, as a rolling deploy would
 * leave them, so every claim reads past them. `--statements unnamed` sends
 * the claim and the settle unnamed, as a pass does once it learned that its
 * path keeps no prepared statements; `--template-sql` runs a statement on
 * the template first, to compare a schema or a setting (`DROP INDEX
 * outlive.tasks_lease_idx`, `ALTER TABLE outlive.tasks SET (fillfactor =
 * 100)`); `--db`
 * names the database, so two loops can run side by side on two databases;
 * `--pooler` runs through a PgBouncer in transaction mode (Debian's,
 * started here; one client only, so its backend, whose CPU is read, stays
 * the same). Prints, per round: tasks/s,
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
import { claim } from '../src/pass/claim.ts';
import { toExecutor, type Executor } from '../src/db/executor.ts';
import { migrate } from '../src/node/migrate.ts';
import { DROP_SQL, SUCCEED_SQL } from '../src/pass/settle.ts';
import { Admin, urlFor } from './lib/postgres.ts';
import { startPgBouncer } from '../test/support/pgbouncer.ts';

const { values } = parseArgs({
  options: {
    clients: { type: 'string', default: '1' },
    batch: { type: 'string', default: '500' },
    tasks: { type: 'string', default: '100000' },
    others: { type: 'string', default: '0' },
    rounds: { type: 'string', default: '1' },
    settle: { type: 'string', default: 'keep' },
    names: { type: 'string', default: '1' },
    unknown: { type: 'string', default: '0' },
    statements: { type: 'string', default: 'named' },
    pooler: { type: 'boolean', default: false },
    db: { type: 'string', default: 'bench_loop' },
    'template-sql': { type: 'string', default: '' },
  },
});
const clients = Number(values.clients);
const batch = Number(values.batch);
const tasks = Number(values.tasks);
const others = Number(values.others);
const rounds = Number(values.rounds);
const settleMode = values.settle;
const names = ['noop', ...Array.from({ length: Number(values.names) - 1 }, (_, i) => `other-task-${i}`)];
const unknown = Number(values.unknown);
if (settleMode !== 'keep' && settleMode !== 'drop' && settleMode !== 'history') {
  throw new Error(`--settle is keep, drop or history, not ${settleMode}`);
}
const unnamed = values.statements === 'unnamed';
if (!unnamed && values.statements !== 'named') throw new Error(`--statements is named or unnamed, not ${values.statements}`);
if (values.pooler && clients !== 1) throw new Error('--pooler measures one client: its backend is the one whose CPU is read');

// The history design: the row leaves outlive.tasks under DROP_SQL's
// compare-and-set and its finished form goes to a table with only a primary
// key. (A BRIN index on id instead of the key measured 0.3 ms per 1,000 less.)
const HISTORY_TABLE = `
CREATE TABLE outlive.bench_history (
  id bigint PRIMARY KEY, name text NOT NULL, queue text NOT NULL, input jsonb NOT NULL, output jsonb,
  attempts integer NOT NULL, created_at timestamptz NOT NULL, started_at timestamptz, finished_at timestamptz NOT NULL)`;
const HISTORY_SQL = `
WITH d AS (
  DELETE FROM outlive.tasks t
  USING unnest($2::bigint[], $3::text[]) AS s(id, output)
  WHERE t.id = s.id AND t.state = 'running' AND t.lease_owner = $4
  RETURNING t.id, t.name, t.queue, t.input, s.output, t.attempts, t.created_at, t.started_at)
INSERT INTO outlive.bench_history
SELECT id, name, queue, input, output::jsonb, attempts, created_at, started_at, coalesce($1::timestamptz, now()) FROM d
RETURNING id::text`;

// --db names the database, so that two loops can run side by side, each on its own.
const DB = values.db;
const TEMPLATE = `${DB}_tpl`;
const admin = await Admin.connect();
const pooler = values.pooler ? await startPgBouncer(urlFor(DB)) : null;
await admin.recreate(TEMPLATE);
await migrate(urlFor(TEMPLATE));
if (values['template-sql']) {
  const template = new pg.Client({ connectionString: urlFor(TEMPLATE) });
  await template.connect();
  await template.query(values['template-sql']);
  await template.end();
}
if (settleMode === 'history') {
  const template = new pg.Client({ connectionString: urlFor(TEMPLATE) });
  await template.connect();
  await template.query(HISTORY_TABLE);
  await template.end();
}

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
  await setup.query(
    `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, priority)
     SELECT 'unknown-task', '{}', 3, 30000, 1 FROM generate_series(1, $1::int)`,
    [unknown],
  );
  await setup.query('VACUUM ANALYZE outlive.tasks');
  await setup.query('SELECT pg_stat_reset()');

  const conns = await Promise.all(
    Array.from({ length: clients }, async () => {
      const client = new pg.Client({ connectionString: pooler ? pooler.pooled(url) : url });
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
      const named = toExecutor(client);
      const exec: Executor = unnamed ? { query: (text, params) => named.query(text, params) } : named;
      for (;;) {
        let before = cpuNs(pid);
        // As the worker sends it: a prepared call of outlive.claim (or unnamed).
        const rows = await claim(exec, { owner, limit: batch, maxTimeoutMs: 30_000, queues: null, names, leaseGraceMs: 5_000, leaseMs: 30_000, now: null });
        claimNs += cpuNs(pid) - before;
        claims++;
        if (rows.length === 0) return;
        before = cpuNs(pid);
        const ids = rows.map((r) => r.id);
        const done =
          settleMode === 'drop'
            ? await client.query({ ...(unnamed ? {} : { name: 'drop' }), text: DROP_SQL, values: [ids, owner, rows.map((r) => r.attempts)] })
            : settleMode === 'history'
              ? await client.query({ ...(unnamed ? {} : { name: settleMode }), text: HISTORY_SQL, values: [null, ids, ids.map(() => null), owner] })
              : await client.query({ ...(unnamed ? {} : { name: settleMode }), text: SUCCEED_SQL, values: [null, ids, ids.map(() => null), owner, rows.map((r) => r.attempts)] });
        settleNs += cpuNs(pid) - before;
        settles++;
        settled += done.rowCount ?? 0;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  for (const { client, pid } of conns) {
    const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    if (rows[0]!.pid !== pid) throw new Error(`round ${round}: the pooler moved the client to another backend; its CPU was not all read`);
    await client.end();
  }

  // Statistics reach the views within a second of the backends going idle.
  await new Promise((r) => setTimeout(r, 1_000));
  const { rows: indexes } = await setup.query<{ index: string; read: number }>(
    `SELECT indexrelname AS index, idx_tup_read::float8 AS read FROM pg_stat_user_indexes
     WHERE schemaname = 'outlive' AND relname = 'tasks' AND idx_tup_read > 0 ORDER BY 1`,
  );
  const { rows: check } = await setup.query<{ twice: number; left: number }>(
    `SELECT count(*) FILTER (WHERE attempts > 1)::int AS twice,
            count(*) FILTER (WHERE state <> 'succeeded' AND lease_owner IS DISTINCT FROM 'others' AND name = 'noop')::int AS left
     FROM outlive.tasks`,
  );
  await setup.end();
  if (settled !== tasks || check[0]!.twice !== 0 || check[0]!.left !== 0) {
    throw new Error(`round ${round}: settled ${settled} of ${tasks}, ${check[0]!.twice} claimed twice, ${check[0]!.left} left`);
  }
  const perK = (ns: number) => ((ns / 1e6) * 1000) / tasks;
  console.log(
    `round ${round}: ${pooler ? 'through PgBouncer, ' : ''}${unnamed ? 'unnamed' : 'named'} statements, ${clients} client(s), batches of ${batch}, ${others} other running rows, ${names.length} name(s) claimed, ${unknown} unknown ready ahead, successes ${{ keep: 'kept', drop: 'deleted', history: 'moved to a history table' }[settleMode]}: ` +
      `${Math.round(tasks / seconds).toLocaleString('en-US')} tasks/s; Postgres CPU per 1,000 tasks ` +
      `claim ${perK(claimNs).toFixed(1)} + settle ${perK(settleNs).toFixed(1)} = ${perK(claimNs + settleNs).toFixed(1)} ms; ` +
      `index entries read per claim and settle: ${indexes.map((i) => `${i.index} ${Math.round(i.read / (i.index === 'tasks_claim_idx' ? claims : settles))}`).join(', ')}`,
  );
}
await pooler?.stop();
await admin.drop(DB);
await admin.drop(TEMPLATE);
await admin.close();
