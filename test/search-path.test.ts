/**
 * Safe in a shared database (issue 25): no statement outlive sends runs a
 * function or operator that another role planted on the search path.
 *
 * A second role, a real login role that is not a superuser, with CREATE on
 * `public`, USAGE on `outlive` and a schema of its own named like the app's
 * role (first on the default path `"$user", public`), plants look-alikes of
 * pg_catalog's functions and operators there and in `public`
 * (test/support/plants.ts): copies with the same argument types, and exact
 * matches for the types outlive's statements give them, which Postgres
 * prefers to pg_catalog's polymorphic or "any" ones even with pg_catalog
 * searched first. Each counts its calls in a sequence. Then the app does
 * everything outlive does, on three paths: the default, `public` alone (a
 * role with nothing but CREATE on public), and the planter's schema before
 * pg_catalog. Every operation must work and no plant may have run.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { z } from 'zod';
import {
  applyRetention, cancelRun, defineSchedule, defineTask, enqueue, enqueueDue, enqueueMany, explainRun, recover,
  retryRun, retryTask, signal, sleepStep, startRun, step, tick, waitFor,
} from '../src/index.js';
import { createWorker } from '../src/node/index.js';
import { finishedPerMinute, getTask, listFailures, listRuns, listSchedules, listTasks, runEdges, status } from '../src/admin/queries.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { metricsSnapshot } from '../src/admin/metrics.js';
import { useNonce } from '../src/http/nudge.js';
import { main } from '../src/node/cli.js';
import { freshDb } from './support/db.js';
import { COUNT_PLANTS_SQL, plantsSql } from './support/plants.js';
import { findingsIn, unqualifiedNames } from './support/sql-names.js';

const db = await freshDb();

// The test's own reads and writes: a path of pg_catalog alone, so they run
// none of the plants and do not count.
const inspector = db.newPool({ connectionString: db.directUrl, options: '-c search_path=pg_catalog', max: 4 });
const q = async <R = Record<string, unknown>>(text: string, params?: unknown[]) => (await inspector.query(text, params)).rows as R[];

const appRole = (await q<{ r: string }>('SELECT current_user AS r'))[0]!.r;
const planter = `outlive_planter_${process.pid}`;
const ident = (name: string) => `"${name.replace(/"/g, '""')}"`;

/** Makes the planting role and lets it plant; returns how many plants it made in its schema. */
async function plant(): Promise<{ functions: number; aggregates: number; operators: number }> {
  await q(`DROP ROLE IF EXISTS ${planter}`);
  await q(`CREATE ROLE ${planter} LOGIN NOSUPERUSER PASSWORD 'planter'`);
  await q(`GRANT CREATE ON SCHEMA public TO ${planter}`);
  await q(`GRANT USAGE ON SCHEMA outlive TO ${planter}`);
  await q(`CREATE SCHEMA ${ident(appRole)} AUTHORIZATION ${planter}`);
  const url = new URL(db.directUrl);
  url.username = planter;
  url.password = 'planter';
  const client = new pg.Client({ connectionString: url.toString() });
  await client.connect();
  try {
    const [{ superuser }] = (await client.query<{ superuser: boolean }>(`SELECT rolsuper AS superuser FROM pg_catalog.pg_roles WHERE rolname = current_user`)).rows as [{ superuser: boolean }];
    expect(superuser).toBe(false);
    await client.query(plantsSql(appRole));
    await client.query(plantsSql('public'));
    return (await client.query(COUNT_PLANTS_SQL, [appRole])).rows[0];
  } finally {
    await client.end();
  }
}

const made = await plant();
// Registered after freshDb's drop of the database, so run before it: the
// role's objects go first (a role that owns objects cannot be dropped).
afterAll(async () => {
  await q(`DROP OWNED BY ${planter}`);
  await q(`DROP ROLE ${planter}`);
});

async function hits(): Promise<number> {
  const rows = await q<{ n: string }>(
    `SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS n FROM ${ident(appRole)}.hits
     UNION ALL SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.hits`,
  );
  return rows.reduce((s, r) => s + Number(r.n), 0);
}

/** The tasks of one scenario; handlers note what they saw. */
function scenarioTasks(seen: string[]) {
  const ok = defineTask({ name: 'sp-ok', input: z.object({ n: z.number() }), run: ({ n }) => ({ n }) });
  let failedOnce = false;
  const flaky = defineTask({
    name: 'sp-flaky',
    input: z.object({}),
    retry: { maxAttempts: 3, backoff: () => 0 },
    run: () => {
      if (!failedOnce) {
        failedOnce = true;
        throw new Error('the first attempt fails');
      }
      return 'second';
    },
  });
  const doomed = defineTask({
    name: 'sp-doomed',
    input: z.object({}),
    retry: { maxAttempts: 1 },
    run: () => {
      throw new Error('fails for good');
    },
  });
  const dropped = defineTask({ name: 'sp-dropped', input: z.object({}), keepSucceeded: false, run: () => null });
  const slow = defineTask({
    name: 'sp-slow',
    input: z.object({}),
    run: async (_input, ctx) => {
      await new Promise((r) => setTimeout(r, 300));
      seen.push(`heartbeat ${await ctx.heartbeat()}`);
      return null;
    },
  });
  const spawner = defineTask({
    name: 'sp-spawner',
    input: z.object({}),
    run: async (_input, ctx) => {
      seen.push(`output ${JSON.stringify(await ctx.output('first'))}`);
      seen.push(`outputs ${JSON.stringify(await ctx.outputs())}`);
      ctx.spawn('child', step(ok, { n: 3 }, { after: ['first'] }));
      ctx.spawn('grandchild', step(ok, { n: 4 }, { after: ['child'] }));
      return 'spawned';
    },
  });
  return { ok, flaky, doomed, dropped, slow, spawner, all: [ok, flaky, doomed, dropped, slow, spawner] };
}

const EMPTY = `TRUNCATE outlive.tasks, outlive.runs, outlive.task_deps, outlive.schedules, outlive.schedule_slots,
  outlive.used_nonces, outlive.known_tasks, outlive.leases, outlive.recounts`;

const states = async (ids: string[]) =>
  Object.fromEntries(
    (await q<{ id: string; state: string }>(`SELECT id::text, state::text FROM outlive.tasks WHERE id = ANY($1::bigint[])`, [ids])).map((r) => [r.id, r.state]),
  );
const runState = async (id: string) => (await q<{ state: string }>(`SELECT state::text FROM outlive.runs WHERE id = $1`, [id]))[0]?.state;

const PATHS: [string, string][] = [
  ['the default path, the planter\'s schema first as "$user"', '"$user",public'],
  ['public alone, where CREATE on public is all a role needs', 'public'],
  ["the planter's schema listed before pg_catalog", `${ident(appRole)},pg_catalog,public`],
];

describe('a role that can create objects on the search path', () => {
  it('planted look-alikes of pg_catalog\'s functions and operators, made from the catalog', () => {
    // Guards the generator: every kind of plant is there in numbers.
    expect(made.functions).toBeGreaterThan(2_000);
    expect(made.aggregates).toBeGreaterThan(50);
    expect(made.operators).toBeGreaterThan(900);
  });

  it.each(PATHS)('runs none of them when the app works on %s', { timeout: 180_000 }, async (_label, path) => {
    await q(EMPTY);
    const pool = db.newPool({ connectionString: db.directUrl, options: `-c search_path=${path}`, max: 10 });
    pool.on('error', () => undefined);
    const [{ search_path }] = (await pool.query('SHOW search_path')).rows as [{ search_path: string }];
    expect(search_path.replace(/ /g, '')).toBe(path);

    // Which plants each operation reached, from their notices.
    let current = 'setup';
    const reached = new Map<string, Set<string>>();
    pool.on('connect', (client) =>
      client.on('notice', (n) => {
        if (!n.message?.startsWith('outlive-plant: ')) return;
        const set = reached.get(current) ?? reached.set(current, new Set()).get(current)!;
        set.add(n.message.slice('outlive-plant: '.length));
      }),
    );
    const failures: string[] = [];
    const before = await hits();
    const seen: string[] = [];
    const t = scenarioTasks(seen);
    const ids: Record<string, string> = {};
    const runs: Record<string, string> = {};

    const steps: [string, () => Promise<void>][] = [
      ['enqueue', async () => {
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          ids.ok = (await enqueue(client, t.ok, { n: 1 })).id;
          ids.flaky = (await enqueue(client, t.flaky, {})).id;
          ids.doomed = (await enqueue(client, t.doomed, {})).id;
          ids.dropped = (await enqueue(client, t.dropped, {})).id;
          ids.slow = (await enqueue(client, t.slow, {})).id;
          ids.keyed = (await enqueue(client, t.ok, { n: 2 }, { key: 'k' })).id;
          const again = await enqueue(client, t.ok, { n: 2 }, { key: 'k' });
          expect(again).toMatchObject({ id: ids.keyed, deduplicated: true });
          await client.query('COMMIT');
        } finally {
          client.release();
        }
      }],
      ['enqueueMany', async () => {
        const rows = await enqueueMany(pool, t.ok, [{ n: 10 }, { n: 11 }, { n: 10 }, { n: 2 }], { key: ({ n }) => (n === 2 ? 'k' : `k${n}`) });
        expect(rows.map((r) => r.deduplicated)).toEqual([false, false, true, true]);
      }],
      ['startRun', async () => {
        const good = await startRun(pool, 'sp-good', { first: step(t.ok, { n: 5 }), second: step(t.spawner, {}, { after: ['first'] }) });
        runs.good = good.id;
        const bad = await startRun(pool, 'sp-bad', {
          a: step(t.doomed, {}),
          b: step(t.ok, { n: 6 }, { after: ['a'] }),
          c: step(t.ok, { n: 7 }, { after: ['b'] }),
        });
        runs.bad = bad.id;
        const later = await startRun(pool, 'sp-later', {
          x: step(t.ok, { n: 8 }, { runAt: new Date(Date.now() + 3_600_000) }),
          y: step(t.ok, { n: 9 }, { after: ['x'] }),
        });
        runs.later = later.id;
      }],
      ['a pass: claim, settle, retry, fail, skip, spawn, finish runs', async () => {
        // A pass of standalone tasks alone deletes those of keepSucceeded: false.
        let claimed = (await tick(pool, { tasks: [t.dropped] })).claimed;
        for (let i = 0; i < 5; i++) claimed += (await tick(pool, { tasks: t.all, leaseCheckMs: 50 })).claimed;
        expect(claimed).toBeGreaterThan(10);
        expect(await states([ids.ok!, ids.flaky!, ids.doomed!, ids.slow!])).toEqual({
          [ids.ok!]: 'succeeded', [ids.flaky!]: 'succeeded', [ids.doomed!]: 'failed', [ids.slow!]: 'succeeded',
        });
        expect(await states([ids.dropped!])).toEqual({});
        expect(await runState(runs.good!)).toBe('succeeded');
        expect(await runState(runs.bad!)).toBe('failed');
        expect(await q(`SELECT step, state::text FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [runs.bad])).toEqual([
          { step: 'a', state: 'failed' }, { step: 'b', state: 'skipped' }, { step: 'c', state: 'skipped' },
        ]);
        expect(await q(`SELECT count(*)::int AS n FROM outlive.tasks WHERE run_id = $1 AND state = 'succeeded'`, [runs.good])).toEqual([{ n: 4 }]);
        expect(seen).toContain('heartbeat true');
        expect(seen).toContain('output {"n":5}');
      }],
      ['recovery of expired leases', async () => {
        const lone = await enqueue(pool, t.ok, { n: 20 });
        const run = await startRun(pool, 'sp-recovered', { p: step(t.ok, { n: 21 }, { maxAttempts: 1 }), q: step(t.ok, { n: 22 }, { after: ['p'] }) });
        const recount = await startRun(pool, 'sp-recount', { r: step(t.ok, { n: 23 }, { runAt: new Date(Date.now() + 3_600_000) }), s: step(t.ok, { n: 24 }, { after: ['r'] }) });
        await q(
          `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'gone', lease_expires_at = now() - interval '1 hour'
           WHERE id = ANY($1::bigint[])`,
          [[lone.id, run.tasks.p]],
        );
        await q(`INSERT INTO outlive.leases (owner, expires_at) VALUES ('gone', now() - interval '1 hour')`);
        await q(`UPDATE outlive.tasks SET waiting_on = 5 WHERE id = $1`, [recount.tasks.s]);
        await q(`INSERT INTO outlive.recounts (task_id) VALUES ($1)`, [recount.tasks.s]);
        const report = await recover(pool);
        expect(report).toMatchObject({ retried: 1, failed: 1, recounted: 1 });
        expect(await states([run.tasks.q!])).toEqual({ [run.tasks.q!]: 'skipped' });
        expect(await runState(run.id)).toBe('failed');
        expect(await q(`SELECT count(*)::int AS n FROM outlive.leases`)).toEqual([{ n: 0 }]);
      }],
      ['waits and signals', async () => {
        await signal(pool, 'sp:kept', 'early', { id: 'e' });
        const run = await startRun(pool, 'sp-waits', {
          kept: waitFor('sp:kept'), parked: waitFor('sp:later'), nap: sleepStep({ ms: 0 }), last: step(t.ok, { n: 30 }, { after: ['kept', 'parked', 'nap'] }),
        });
        expect(await tick(pool, { tasks: t.all })).toMatchObject({ parked: 1 });
        expect(await signal(pool, 'sp:later', 'now', { id: 'l' })).toEqual({ delivered: 1, duplicate: false });
        await tick(pool, { tasks: t.all });
        expect(await runState(run.id)).toBe('succeeded');
      }],
      ['cancel', async () => {
        expect(await cancelRun(pool, runs.later!)).toMatchObject({ cancelled: true, pendingCancelled: 2 });
      }],
      ['retry', async () => {
        expect(await retryRun(pool, runs.bad!)).toMatchObject({ retried: true, tasks: 3 });
        expect(await retryTask(pool, ids.doomed!)).toMatchObject({ retried: true });
      }],
      ['schedules', async () => {
        const at = new Date('2030-01-01T00:00:30Z');
        const every = defineSchedule({ name: 'sp-minutely', cron: '* * * * *', task: t.ok, input: { n: 30 } });
        expect((await enqueueDue(pool, [every], { now: at })).added).toEqual(['sp-minutely']);
        expect((await enqueueDue(pool, [every], { now: new Date(at.getTime() + 60_000) })).enqueued).toHaveLength(1);
        const hourly = defineSchedule({ name: 'sp-minutely', cron: '0 * * * *', task: t.ok, input: { n: 31 } });
        expect((await enqueueDue(pool, [hourly], { now: new Date(at.getTime() + 120_000) })).changed).toEqual(['sp-minutely']);
        expect((await enqueueDue(pool, [], { now: new Date(at.getTime() + 180_000) })).removed).toEqual(['sp-minutely']);
        // On the database's clock.
        expect((await enqueueDue(pool, [])).enqueued).toEqual([]);
      }],
      ["a drain's nonce", async () => {
        const now = new Date();
        expect(await useNonce(pool, 'sp-nonce', now, { now })).toBe(true);
        expect(await useNonce(pool, 'sp-nonce', now, { now })).toBe(false);
      }],
      ['explain', async () => {
        expect((await explainRun(pool, runs.good!))?.state).toBe('succeeded');
        expect((await explainRun(pool, runs.bad!))?.tasks.map((x) => x.why)).toContain('waiting for "a" to succeed');
      }],
      ["the operator's queries", async () => {
        expect((await status(pool)).tasks.succeeded).toBeGreaterThan(0);
        expect(await listTasks(pool, { state: 'succeeded', name: 'sp-ok', queue: 'default', runId: runs.good!, byFinished: true })).toHaveLength(3);
        await listFailures(pool);
        expect((await getTask(pool, ids.ok!))?.state).toBe('succeeded');
        expect(await listRuns(pool, { state: 'succeeded' })).not.toHaveLength(0);
        expect(await runEdges(pool, runs.good!)).toHaveLength(3);
        expect((await finishedPerMinute(pool, 5)).reduce((s, m) => s + m.succeeded, 0)).toBeGreaterThan(0);
        await listSchedules(pool);
      }],
      ['the metrics', async () => {
        const m = await metricsSnapshot(pool);
        expect(m.queues.find((q) => q.queue === 'default')?.finished.succeeded).toBeGreaterThan(0);
        expect(m.attemptSeconds[0.5]).not.toBeNull();
      }],
      ['the dashboard', async () => {
        const token = 'sp-dashboard-token-of-some-length';
        const get = (path: string, method = 'GET') =>
          handleDashboard(new Request(`http://app.test/dashboard${path}`, { method, headers: { authorization: `Bearer ${token}` } }), pool, { token, log: () => undefined });
        for (const path of ['/', `/runs/${runs.good}`, `/tasks/${ids.ok}`]) expect((await get(path)).status, path).toBe(200);
        await tick(pool, { tasks: t.all });
        expect((await get(`/tasks/${ids.doomed}/retry`, 'POST')).headers.get('location')).toMatch(/flash=task-retried/);
        expect((await get(`/runs/${runs.bad}/retry`, 'POST')).headers.get('location')).toMatch(/flash=run-retried/);
        expect((await get(`/runs/${runs.bad}/cancel`, 'POST')).headers.get('location')).toMatch(/flash=run-cancelled/);
        // Flow control's page and forms: a key paused and resumed, a queue too.
        const form = (path: string, body: string) =>
          handleDashboard(
            new Request(`http://app.test/dashboard${path}`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-www-form-urlencoded' }, body }),
            pool, { token, log: () => undefined },
          );
        expect((await form('/limits/pause', 'key=sp-key&for=60000&reason=sp')).headers.get('location')).toMatch(/flash=key-paused/);
        expect((await form('/queues/pause', 'queue=sp-queue')).headers.get('location')).toMatch(/flash=queue-paused/);
        for (const path of ['/', '/limits']) expect((await get(path)).status, path).toBe(200);
        expect((await form('/limits/resume', 'key=sp-key')).headers.get('location')).toMatch(/flash=key-resumed/);
        expect((await form('/queues/resume', 'queue=sp-queue')).headers.get('location')).toMatch(/flash=queue-resumed/);
      }],
      ['the CLI', async () => {
        const url = new URL(db.directUrl);
        url.searchParams.set('options', `-c search_path=${path}`);
        const out: string[] = [];
        const io = { out: (line: string) => void out.push(line), err: (line: string) => void out.push(line) };
        for (const args of [
          ['status'], ['runs'], ['tasks', '--state', 'failed'], ['run', runs.good!], ['task', ids.ok!],
          ['limit', 'set', 'sp-cli', '--concurrency', '2', '--rate', '10/1m'], ['limit', 'pause', 'sp-cli', '--for', '1m'], ['queue', 'pause', 'sp-cli-q'],
          ['limits'], ['status'], ['limit', 'resume', 'sp-cli'], ['queue', 'resume', 'sp-cli-q'], ['weight', 'default', 'sp-cli', '2'],
        ]) {
          expect(await main([...args, '--database-url', url.toString()], io), `${args.join(' ')}: ${out.join('\n')}`).toBe(0);
        }
      }],
      ['the LISTEN worker', async () => {
        const errors: string[] = [];
        const worker = createWorker({
          pool, tasks: [t.ok], pollIntervalMs: 60_000, retention: false,
          logger: { info: () => undefined, warn: (m) => void errors.push(m), error: (m) => void errors.push(m) },
        });
        await worker.start();
        try {
          const client = await pool.connect();
          let id: string;
          try {
            await client.query('BEGIN');
            id = (await enqueue(client, t.ok, { n: 40 })).id;
            await client.query('COMMIT');
          } finally {
            client.release();
          }
          for (let i = 0; i < 500 && (await states([id]))[id] !== 'succeeded'; i++) await new Promise((r) => setTimeout(r, 20));
          expect(await states([id])).toEqual({ [id]: 'succeeded' });
          expect(worker.stats.notifications).toBeGreaterThan(0);
        } finally {
          await worker.stop({ graceMs: 1_000 });
        }
        expect(errors).toEqual([]);
      }],
      ['retention', async () => {
        await q(`UPDATE outlive.tasks SET state = 'cancelled', finished_at = now() WHERE state IN ('pending', 'running')`);
        await q(`UPDATE outlive.runs SET state = 'cancelled', finished_at = now() WHERE state = 'running'`);
        const report = await applyRetention(pool, { now: new Date('2031-01-01T00:00:00Z') });
        expect(report).toMatchObject({ more: false });
        expect(report.tasks).toBeGreaterThan(0);
        expect(report.runTasks).toBeGreaterThan(0);
        expect(report.runs).toBeGreaterThan(0);
        expect(report.slots).toBeGreaterThan(0);
        // On the database's clock: nothing is that old.
        expect(await applyRetention(pool)).toMatchObject({ tasks: 0, runs: 0 });
      }],
    ];

    for (const [name, run] of steps) {
      current = name;
      try {
        await run();
      } catch (err) {
        failures.push(`${name}: ${(err as Error).message.split('\n')[0]}`);
      }
    }
    current = 'after';
    const counted = (await hits()) - before;
    const report = [...reached].map(([name, set]) => `${name}: ${[...set].sort().join('; ')}`);
    expect({ failures, reached: report, counted }).toEqual({ failures: [], reached: [], counted: 0 });
  });
});

describe('the functions outlive defines', () => {
  it('run with their search_path pinned to pg_catalog, then pg_temp', async () => {
    const functions = await q<{ fn: string; config: string[] | null }>(
      `SELECT p.oid::regprocedure::text AS fn, p.proconfig AS config FROM pg_proc p WHERE p.pronamespace = 'outlive'::regnamespace ORDER BY 1`,
    );
    expect(functions.map((f) => f.fn)).toEqual([
      'outlive.begin_waits(bigint[],integer[],text,timestamp with time zone)',
      'outlive.claim(timestamp with time zone,integer,text[],integer,text,integer,integer)',
      'outlive.claim(timestamp with time zone,integer,text[],integer,text,integer,integer,text[])',
      'outlive.claim_governed(timestamp with time zone,integer,text[],integer,text,integer,integer,text[],boolean)',
      'outlive.claim_tasks(timestamp with time zone,integer,text[],integer,text,integer,integer,text[],integer)',
      'outlive.enqueue_keyed(text,text,integer,integer,integer,timestamp with time zone,text[],text[],text[],text[],boolean,text)',
      'outlive.fair_start(text,text)',
      'outlive.finish_runs(timestamp with time zone,bigint[],integer[],bigint[],text[])',
      'outlive.notify_ready()',
      'outlive.rate_next_start(jsonb,double precision,double precision,double precision,double precision,double precision)',
      'outlive.release_dependents(bigint[],timestamp with time zone)',
      'outlive.release_slots(jsonb,timestamp with time zone)',
      'outlive.send_signal(text,text,jsonb,bigint)',
      'outlive.signal_lock(text)',
    ]);
    for (const f of functions) expect(f.config, f.fn).toContain('search_path=pg_catalog, pg_temp');
  });
});

// A second line, which needs no database and sees statements no test runs:
// the SQL in src/ read for names looked up on the path.
describe('the SQL in src/', () => {
  it('names every function and operator with its schema (ARCHITECTURE.md, "Names in SQL")', () => {
    // Not read here: migrate.ts, whose transaction pins its own path
    // (SET LOCAL search_path = pg_catalog, pg_temp) before it sends anything,
    // and grants.ts, whose GRANT lists (UPDATE (state, ...)) read to this
    // check as calls. test/roles.test.ts runs both.
    expect(findingsIn('src', ['src/node/migrate.ts', 'src/node/grants.ts'])).toEqual([]);
  });

  it('is read by a check that finds what the path would resolve', () => {
    expect(unqualifiedNames(`SELECT count(*) FROM outlive.tasks WHERE state = 'pending' AND run_at <= now()`)).toEqual([
      'function count()', 'operator =', 'operator <=', 'function now()',
    ]);
    expect(unqualifiedNames(`UPDATE outlive.tasks SET errors = errors || jsonb_build_array($1::jsonb), attempts = attempts + 1 WHERE id = ANY($2)`)).toEqual([
      'operator ||', 'function jsonb_build_array()', 'operator +', 'operator =',
    ]);
    expect(unqualifiedNames(`SELECT 1 WHERE a IN ('x') OR b NOT IN ('y') OR c IS NOT DISTINCT FROM d OR e BETWEEN 1 AND 2 OR nullif(f, 0) > 1 OR g LIKE 'h%'`)).toEqual([
      'IN', 'IN', 'IS DISTINCT FROM', 'BETWEEN', 'NULLIF', 'operator >', 'LIKE',
    ]);
    expect(unqualifiedNames(`SELECT CASE s WHEN 'a' THEN 1 END, x OPERATOR(public.=) y FROM unnest($1::int[], $2::text[]) AS u(a, b)`)).toEqual([
      'CASE x WHEN', "OPERATOR(public.=), not pg_catalog's", 'function unnest()',
    ]);
    expect(unqualifiedNames(`
      WITH RECURSIVE down(id) AS (SELECT 1), ready AS (SELECT id FROM outlive.tasks t WHERE t.state OPERATOR(pg_catalog.=) ANY (ARRAY['a']::outlive.task_state[]))
      UPDATE outlive.tasks t SET state = 'x', attempts = greatest(t.attempts OPERATOR(pg_catalog.-) 1, 0), run_at = coalesce($1::timestamptz, pg_catalog.now())
      FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::int[])) AS s(id, n)
      WHERE (t.attempts OPERATOR(pg_catalog.=) s.n) IS TRUE AND NOT EXISTS (SELECT pg_catalog.count(*) FILTER (WHERE s.id IS NULL))
      RETURNING t.id::text, (xmax OPERATOR(pg_catalog.=) 0) AS inserted`)).toEqual([]);
  });
});
