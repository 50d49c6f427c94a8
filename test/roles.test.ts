/**
 * The least privileges of each part, on real roles: a migrator that owns
 * schema outlive (it ran migrate, and may CREATE in the database and nothing
 * more), and the app, the worker and the dashboard, each holding exactly what
 * `grants()` gives it. Each part's operations run as its role, and each role
 * is shown refused what it should not do. No role here is a superuser.
 *
 * Direct connections throughout: the suite's PgBouncer signs every client in
 * as the one user its configuration names.
 */
import { readFileSync } from 'node:fs';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { z } from 'zod';
import {
  batchEnqueue,
  defineSchedule,
  defineTask,
  enqueue,
  enqueuedFrom,
  enqueueDue,
  enqueueMany,
  applyRetention,
  NonRetriableError,
  RateLimitedError,
  recover,
  signNudge,
  startRun,
  step,
  tick,
} from '../src/index.js';
import { createWorker, grants, migrate } from '../src/node/index.js';
import { FUNCTION_CALLERS, SEQUENCE_USERS, TABLE_PRIVILEGES } from '../src/node/grants.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { verifyNudge } from '../src/http/nudge.js';
import { getTask, listTasks, status } from '../src/admin/queries.js';
import { closePool, openPool } from './support/db.js';
import { createRole, ident } from './support/roles.js';

const name = `outlive_t_${process.pid}_roles_${Date.now().toString(36)}`;
const dbUrl = (() => {
  const u = new URL(inject('pgUrl'));
  u.pathname = `/${name}`;
  return u.toString();
})();
const admin = new pg.Client({ connectionString: inject('pgUrl') });
await admin.connect();
await admin.query(`CREATE DATABASE ${name}`);
await admin.end();

const migrator = await createRole('migrator');
const app = await createRole('app');
const worker = await createRole('worker');
const dashboard = await createRole('dashboard');
const other = await createRole('bystander');

const pools: pg.Pool[] = [];
function poolAs(url: string, max = 10): pg.Pool {
  const pool = openPool({ connectionString: url, max });
  // The roles are dropped after the file, their idle sessions ended first.
  pool.on('error', () => undefined);
  pools.push(pool);
  return pool;
}
/** The suite's superuser, for setting the scene and reading what happened. */
const root = poolAs(dbUrl);
await root.query(`GRANT CREATE ON DATABASE ${name} TO ${migrator.name}`);

afterAll(async () => {
  await Promise.all(pools.map(closePool));
  const c = new pg.Client({ connectionString: inject('pgUrl') });
  await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await c.end();
});

await migrate(migrator.urlOn(dbUrl));
const ROLES = { app: app.name, worker: worker.name, dashboard: dashboard.name };
const asMigrator = poolAs(migrator.urlOn(dbUrl), 2);
await asMigrator.query(grants(ROLES));
const asApp = poolAs(app.urlOn(dbUrl));
const asWorker = poolAs(worker.urlOn(dbUrl), 20);
const asDashboard = poolAs(dashboard.urlOn(dbUrl));
const asOther = poolAs(other.urlOn(dbUrl), 2);

/** Every privilege any role holds on schema outlive and its objects, as text, for comparing. */
async function privileges(): Promise<string[]> {
  const { rows } = await root.query<{ p: string }>(`
    SELECT 'schema ' || coalesce(nspacl::text, '') AS p FROM pg_namespace WHERE nspname = 'outlive'
    UNION ALL SELECT relname || ' ' || coalesce(relacl::text, '') FROM pg_class WHERE relnamespace = 'outlive'::regnamespace AND relkind IN ('r', 'S')
    UNION ALL SELECT c.relname || '.' || a.attname || ' ' || a.attacl::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      WHERE c.relnamespace = 'outlive'::regnamespace AND a.attacl IS NOT NULL
    UNION ALL SELECT oid::regprocedure::text || ' ' || coalesce(proacl::text, 'default') FROM pg_proc WHERE pronamespace = 'outlive'::regnamespace
    ORDER BY 1`);
  return rows.map((r) => r.p);
}

/** The message a statement run as `pool`'s role is refused with. */
async function refused(pool: pg.Pool, text: string, params: unknown[] = []): Promise<string> {
  const err = await pool.query(text, params).then(
    () => null,
    (e: Error) => e,
  );
  expect(err, `${text} was expected to be refused`).toBeInstanceOf(Error);
  return err!.message;
}

const ok = defineTask({ name: 'roles.ok', input: z.object({ n: z.number() }), run: ({ n }) => ({ n }) });
let flakyRuns = 0;
const flaky = defineTask({
  name: 'roles.flaky',
  input: z.object({}),
  retry: { maxAttempts: 3, backoff: () => 0 },
  run: () => {
    if (flakyRuns++ === 0) throw new Error('first attempt fails');
    return 'second';
  },
});
const doomed = defineTask({ name: 'roles.doomed', input: z.object({}), run: () => Promise.reject(new NonRetriableError('no such thing')) });
const fleeting = defineTask({ name: 'roles.fleeting', input: z.object({}), keepSucceeded: false, run: () => null });
const beating = defineTask({
  name: 'roles.beating',
  input: z.object({}),
  run: async (_input, ctx) => {
    await new Promise((r) => setTimeout(r, 50));
    return ctx.heartbeat();
  },
});
const page = defineTask({ name: 'roles.page', input: z.object({ n: z.number() }), run: ({ n }) => n });
const finish = defineTask({ name: 'roles.finish', input: z.object({}), run: async (_i, ctx) => Object.keys(await ctx.outputs()).length });
const crawl = defineTask({
  name: 'roles.crawl',
  input: z.object({ pages: z.number() }),
  run: ({ pages }, ctx) => {
    const names = Array.from({ length: pages }, (_, n) => `page:${n}`);
    names.forEach((s, n) => ctx.spawn(s, step(page, { n })));
    ctx.spawn('finish', step(finish, {}, { after: names }));
    return { pages };
  },
});
let limitedRuns = 0;
const limited = defineTask({
  name: 'roles.limited',
  input: z.object({ c: z.string() }),
  limits: [{ key: 'roles.api', concurrency: 2 }, { key: 'roles.tokens', rate: { limit: 1_000, periodMs: 60_000 }, cost: 10 }],
  fairness: { key: (i) => i.c },
  run: (_i, ctx) => {
    // A 429 first (the key pauses, the attempt is handed back), then the real cost.
    if (limitedRuns++ === 0) throw new RateLimitedError({ key: 'roles.api', retryAfterMs: 0 });
    ctx.reportCost(3);
  },
});
const TASKS = [ok, flaky, doomed, fleeting, beating, page, finish, crawl, limited];

async function drain(): Promise<void> {
  for (let i = 0; i < 10; i++) {
    const r = await tick(asWorker, { tasks: TASKS, leaseCheckMs: 10 });
    if (r.claimed === 0) return;
  }
}

describe('roles of least privilege, each doing its part', () => {
  it('none is a superuser; migrate runs as the migrator only; grants run again change nothing', async () => {
    const { rows } = await root.query(`SELECT rolname::text, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = ANY($1::text[]) ORDER BY 1`, [
      [migrator.name, app.name, worker.name, dashboard.name, other.name],
    ]);
    expect(rows).toHaveLength(5);
    expect(rows.every((r) => !r.rolsuper && !r.rolcreaterole && !r.rolcreatedb && !r.rolbypassrls)).toBe(true);
    expect((await root.query(`SELECT nspowner::regrole::text AS owner FROM pg_namespace WHERE nspname = 'outlive'`)).rows).toEqual([{ owner: migrator.name }]);
    await expect(migrate(app.urlOn(dbUrl))).rejects.toThrow(new RegExp(`schema outlive is owned by role "${migrator.name}", not by "${app.name}"`));
    await migrate(migrator.urlOn(dbUrl));
    const before = await privileges();
    await asMigrator.query(grants(ROLES));
    expect(await privileges()).toEqual(before);
    // PUBLIC may call no function of outlive.
    expect(before.filter((p) => p.includes('(') && /[{,]=X\//.test(p))).toEqual([]);
  });

  it('migration 0021, which makes the claims again to return more columns, leaves each with the grants it had', async () => {
    const before = await privileges();
    const claims = before.filter((p) => /^outlive\.claim/.test(p));
    expect(claims.filter((p) => p.includes(worker.name))).toHaveLength(4);
    const sql = readFileSync(new URL('../db/migrations/0021_claim_returns_trace.sql', import.meta.url), 'utf8');
    const c = await asMigrator.connect();
    try {
      await c.query('BEGIN');
      await c.query('SET LOCAL search_path = pg_catalog, pg_temp');
      await c.query(sql);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    // Neither the worker locked out nor the claims opened to PUBLIC or the app.
    expect(await privileges()).toEqual(before);
    await expect(tick(asWorker, { tasks: [ok] })).resolves.toMatchObject({ stoppedBy: 'drained' });
    expect(await refused(asApp, `SELECT * FROM outlive.claim_tasks(now(), 1000, NULL, 1, 'me', 1000, 1000, ARRAY['roles.ok'], NULL)`)).toMatch(/permission denied for function claim_tasks/);
  });

  it('the app enqueues, deduplicates, batches and starts runs; it cannot change, delete or read others’ tasks, claim, or write elsewhere', async () => {
    const first = await enqueue(asApp, ok, { n: 1 }, { key: 'roles-1' });
    expect(await enqueue(asApp, ok, { n: 1 }, { key: 'roles-1' })).toMatchObject({ id: first.id, deduplicated: true });
    const many = await enqueueMany(asApp, ok, [{ n: 1 }, { n: 2 }, { n: 3 }], { key: (i) => `roles-${i.n}` });
    expect(many.map((t) => t.deduplicated)).toEqual([true, false, false]);
    // Debounce rewrites the pending row of its key through outlive.enqueue_keyed, with no UPDATE on the table.
    const debounced = await enqueue(asApp, ok, { n: 4 }, { key: 'roles-4', keyMode: 'replace' });
    expect(await enqueue(asApp, ok, { n: 5 }, { key: 'roles-4', keyMode: 'replace' })).toMatchObject({ id: debounced.id, replaced: true });
    const client = await asApp.connect();
    try {
      await client.query('BEGIN');
      const inTx = await enqueue(client, flaky, {});
      await client.query('COMMIT');
      expect(inTx.deduplicated).toBe(false);
    } finally {
      client.release();
    }
    const viaDrizzle = await drizzle(asApp).transaction(async (tx) => enqueuedFrom(doomed, await batchEnqueue(tx, doomed, {}, { key: 'doomed' })));
    expect(viaDrizzle.deduplicated).toBe(false);
    expect(enqueuedFrom(doomed, await drizzle(asApp).execute(batchEnqueue(drizzle(asApp), doomed, {}, { key: 'doomed' }) as never))).toMatchObject({
      id: viaDrizzle.id,
      deduplicated: true,
    });
    await enqueue(asApp, beating, {});
    const run = await startRun(asApp, 'roles crawl', { crawl: step(crawl, { pages: 3 }) });
    expect(Object.keys(run.tasks)).toEqual(['crawl']);
    await enqueueMany(asApp, limited, [{ c: 'a' }, { c: 'b' }, { c: 'a' }]);
    await startRun(asApp, 'roles limited', { a: step(limited, { c: 'a' }), b: step(limited, { c: 'b' }, { after: ['a'] }) });
    expect(await refused(asApp, `UPDATE outlive.limits SET running = 0`)).toMatch(/permission denied for table limits/);
    expect(await refused(asApp, `INSERT INTO outlive.queue_pauses (queue) VALUES ('default')`)).toMatch(/permission denied for table queue_pauses/);

    expect(await refused(asApp, `UPDATE outlive.tasks SET key = NULL WHERE id = $1`, [first.id])).toMatch(/permission denied for table tasks/);
    expect(await refused(asApp, `DELETE FROM outlive.tasks WHERE id = $1`, [first.id])).toMatch(/permission denied for table tasks/);
    expect(await refused(asApp, `SELECT input FROM outlive.tasks WHERE id = $1`, [first.id])).toMatch(/permission denied for table tasks/);
    expect(await refused(asApp, `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, state, output) VALUES ('roles.ok', '{}', 1, 1000, 'succeeded', '1')`)).toMatch(
      /permission denied for table tasks/,
    );
    expect(await refused(asApp, `UPDATE outlive.runs SET state = 'cancelled' WHERE id = $1`, [run.id])).toMatch(/permission denied for table runs/);
    expect(await refused(asApp, `SELECT * FROM outlive.claim(now(), 1000, NULL, 1, 'me', 1000, 1000, ARRAY['roles.ok'])`)).toMatch(/permission denied for function claim/);
    expect(await refused(asApp, `INSERT INTO outlive.used_nonces (nonce, expires_at) VALUES ('x', now())`)).toMatch(/permission denied for table used_nonces/);
    expect(await refused(asApp, `SELECT * FROM outlive.migrations`)).toMatch(/permission denied for table migrations/);
  });

  it('the worker runs passes that succeed, fail, retry, spawn and renew their lease; recovers; fires schedules; spends the drain’s nonces; applies retention', async () => {
    await drain();
    const states = (await root.query<{ name: string; state: string }>(`SELECT name, state::text FROM outlive.tasks ORDER BY id`)).rows;
    expect(states.filter((r) => r.state !== 'succeeded' && r.state !== 'failed')).toEqual([]);
    expect(states.filter((r) => r.name === 'roles.doomed').map((r) => r.state)).toEqual(['failed']);
    expect(states.filter((r) => r.name === 'roles.flaky').map((r) => r.state)).toEqual(['succeeded']);
    expect(states.filter((r) => r.name === 'roles.limited').map((r) => r.state)).toEqual(Array(5).fill('succeeded'));
    expect((await root.query(`SELECT key, running FROM outlive.limits ORDER BY key`)).rows).toEqual([
      { key: 'roles.api', running: 0 },
      { key: 'roles.tokens', running: 0 },
    ]);
    // keepSucceeded: false, deleted by its settle (in a pass of its own: one
    // that settles it beside a task of a run keeps its row).
    const gone = await enqueue(asApp, fleeting, {});
    expect(await tick(asWorker, { tasks: [fleeting] })).toMatchObject({ succeeded: 1 });
    expect((await root.query(`SELECT 1 FROM outlive.tasks WHERE id = $1`, [gone.id])).rows).toEqual([]);
    expect((await root.query(`SELECT output FROM outlive.tasks WHERE name = 'roles.beating'`)).rows).toEqual([{ output: true }]);
    expect((await root.query(`SELECT state::text, (SELECT output FROM outlive.tasks t WHERE t.run_id = r.id AND step = 'finish') AS pages FROM outlive.runs r WHERE name = 'roles crawl'`)).rows).toEqual([
      { state: 'succeeded', pages: 3 },
    ]);

    // A pass that died: its row's lease and its pass's lease both expired.
    const { rows: [dead] } = await root.query(
      `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, state, attempts, lease_owner, lease_expires_at, started_at)
       VALUES ('roles.ok', '{"n": 9}', 3, 1000, 'running', 1, 'dead-pass', now() - interval '1 minute', now() - interval '2 minutes') RETURNING id::text`,
    );
    expect((await recover(asWorker)).rows.map((r) => r.id)).toEqual([dead.id]);
    await tick(asWorker, { tasks: TASKS, now: new Date(Date.now() + 60_000) });
    expect((await root.query(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [dead.id])).rows).toEqual([{ state: 'succeeded' }]);

    const hourly = defineSchedule({ name: 'roles.hourly', cron: '0 * * * *', task: ok, input: { n: 7 } });
    await enqueueDue(asWorker, [hourly]);
    const fired = await enqueueDue(asWorker, [hourly], { now: new Date(Date.now() + 3_600_000) });
    expect(fired.enqueued).toHaveLength(1);
    expect((await enqueueDue(asWorker, [], { now: new Date(Date.now() + 3_600_000) })).removed).toEqual(['roles.hourly']);

    const secret = 's'.repeat(40);
    const body = new TextEncoder().encode('{}');
    const endpoint = 'https://app.example/api/drain';
    const signature = await signNudge(secret, endpoint, body);
    const request = { method: 'POST', endpoints: [endpoint], body };
    expect((await verifyNudge(asWorker, secret, signature, request)).ok).toBe(true);
    expect(await verifyNudge(asWorker, secret, signature, request)).toMatchObject({ ok: false, reason: 'replayed' });

    // The LISTEN worker as this role: it checks the schema, listens, runs a pass.
    const lines: string[] = [];
    const w = createWorker({ connectionString: worker.urlOn(dbUrl), tasks: TASKS, logger: { info: (l) => lines.push(l), warn: (l) => lines.push(l), error: (l) => lines.push(l) } });
    await w.start();
    const queued = await enqueue(asApp, ok, { n: 42 });
    for (let i = 0; i < 200 && (await root.query(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [queued.id])).rows[0].state !== 'succeeded'; i++) {
      await new Promise((r) => setTimeout(r, 25));
    }
    await w.stop();
    expect((await root.query(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [queued.id])).rows).toEqual([{ state: 'succeeded' }]);
    expect(lines.filter((l) => /error|failed/i.test(l))).toEqual([]);

    const kept = await applyRetention(asWorker, { now: new Date(Date.now() + 365 * 86_400_000) });
    expect(kept.tasks + kept.runTasks).toBeGreaterThan(0);
    expect(kept.runs).toBe(2);
    expect(kept.slots).toBe(1);
    // Left: the task the schedule's slot an hour ahead enqueued, not run yet.
    expect((await root.query(`SELECT name, state::text FROM outlive.tasks`)).rows).toEqual([{ name: 'roles.ok', state: 'pending' }]);

    expect(await refused(asWorker, `TRUNCATE outlive.tasks`)).toMatch(/permission denied for table tasks/);
    expect(await refused(asWorker, `DROP TABLE outlive.leases`)).toMatch(/must be owner of table leases/);
    expect(await refused(asWorker, `INSERT INTO outlive.migrations (hash, created_at) VALUES ('x', 1)`)).toMatch(/permission denied for table migrations/);
    expect(await refused(asWorker, `CREATE TRIGGER t AFTER INSERT ON outlive.tasks FOR EACH ROW EXECUTE FUNCTION outlive.notify_ready()`)).toMatch(/permission denied for table tasks/);
  });

  it('the dashboard shows its pages and retries and cancels; it cannot insert, delete or rewrite a task; what rows hold is escaped', async () => {
    const TOKEN = 'd'.repeat(40);
    const get = async (path: string) => {
      const res = await handleDashboard(new Request(`https://ops.example/dashboard${path}`, { headers: { authorization: `Bearer ${TOKEN}` } }), asDashboard, { token: TOKEN });
      return { status: res.status, body: await res.text() };
    };
    const post = async (path: string) =>
      handleDashboard(new Request(`https://ops.example/dashboard${path}`, { method: 'POST', headers: { authorization: `Bearer ${TOKEN}` } }), asDashboard, { token: TOKEN });

    const odd = '<script>alert(1)</script>\u001b[2J';
    const failed = await enqueue(asApp, doomed, {}, { key: odd });
    const steps = await startRun(asApp, 'roles odd', { a: step(doomed, {}), b: step(ok, { n: 1 }, { after: ['a'] }) });
    // Text no startRun would take, as another role may write it.
    await root.query(`UPDATE outlive.runs SET name = $1 WHERE id = $2`, [odd, steps.id]);
    await root.query(`UPDATE outlive.tasks SET step = $1 WHERE id = $2`, [`${odd}b`, steps.tasks.b]);
    const running = await startRun(asApp, 'roles running', { only: step(ok, { n: 2 }) });
    await tick(asWorker, { tasks: [doomed] });
    await root.query(`UPDATE outlive.tasks SET lease_owner = $1, queue = $1 WHERE id = $2`, [odd, running.tasks.only]);

    const overview = await get('/');
    expect(overview.status).toBe(200);
    for (const page of [overview, await get(`/runs/${steps.id}`), await get(`/tasks/${failed.id}`), await get(`/tasks/${running.tasks.only}`)]) {
      expect(page.status).toBe(200);
      expect(page.body).not.toContain('<script>alert');
    }
    expect((await get(`/runs/${steps.id}`)).body).toContain('&lt;script&gt;alert(1)&lt;/script&gt;');
    expect((await get(`/tasks/${running.tasks.only}`)).body).toMatch(/<dt>lease<\/dt><dd>&lt;script&gt;/);

    expect((await post(`/tasks/${failed.id}/retry`)).headers.get('location')).toMatch(/flash=task-retried$/);
    expect((await post(`/runs/${steps.id}/retry`)).headers.get('location')).toMatch(/flash=run-retried$/);
    expect((await post(`/runs/${running.id}/cancel`)).headers.get('location')).toMatch(/flash=run-cancelled$/);
    expect((await root.query(`SELECT state::text FROM outlive.runs WHERE id = ANY($1::bigint[]) ORDER BY id`, [[steps.id, running.id]])).rows).toEqual([
      { state: 'running' },
      { state: 'cancelled' },
    ]);
    // Flow control from the dashboard, as this role: its page, a key and a queue paused and resumed.
    const form = (path: string, body: string) =>
      handleDashboard(
        new Request(`https://ops.example/dashboard${path}`, { method: 'POST', headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/x-www-form-urlencoded' }, body }),
        asDashboard, { token: TOKEN },
      );
    expect((await form('/limits/pause', 'key=roles.ops&for=60000&reason=incident')).headers.get('location')).toMatch(/flash=key-paused$/);
    expect((await form('/queues/pause', 'queue=roles.q&reason=deploy')).headers.get('location')).toMatch(/flash=queue-paused$/);
    const limits = await get('/limits');
    expect(limits.status).toBe(200);
    expect(limits.body).toMatch(/<tr data-key="roles\.ops" data-paused="yes">/);
    expect(limits.body).toMatch(/<tr data-queue="roles\.q"><td>roles\.q<\/td><td>deploy<\/td>/);
    expect((await get('/')).body).toContain('<tr data-queue="roles.q">');
    expect((await form('/limits/resume', 'key=roles.ops')).headers.get('location')).toMatch(/flash=key-resumed$/);
    expect((await form('/queues/resume', 'queue=roles.q')).headers.get('location')).toMatch(/flash=queue-resumed$/);
    expect((await root.query(`SELECT paused_until FROM outlive.limits WHERE key = 'roles.ops'`)).rows).toEqual([{ paused_until: null }]);
    expect((await root.query(`SELECT queue FROM outlive.queue_pauses WHERE queue = 'roles.q'`)).rows).toEqual([]);
    // What the CLI's inspecting commands read, as this role.
    expect((await status(asDashboard)).tasks.pending).toBeGreaterThan(0);
    expect((await listTasks(asDashboard, { limit: 5 })).length).toBeGreaterThan(0);
    expect((await getTask(asDashboard, failed.id))?.key).toBe(odd);

    expect(await refused(asDashboard, `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('roles.ok', '{}', 1, 1000)`)).toMatch(/permission denied for table tasks/);
    expect(await refused(asDashboard, `DELETE FROM outlive.tasks WHERE id = $1`, [failed.id])).toMatch(/permission denied for table tasks/);
    expect(await refused(asDashboard, `UPDATE outlive.tasks SET input = '{"n": 0}' WHERE id = $1`, [failed.id])).toMatch(/permission denied for table tasks/);
    expect(await refused(asDashboard, `DELETE FROM outlive.used_nonces`)).toMatch(/permission denied for table used_nonces/);
  });

  it('is what docs/shared-database.md prints, character for character', () => {
    const doc = readFileSync(new URL('../docs/shared-database.md', import.meta.url), 'utf8');
    const printed = doc.slice(doc.indexOf('It prints:\n\n```sql\n') + 'It prints:\n\n```sql\n'.length);
    expect(printed.slice(0, printed.indexOf('\n```'))).toBe(grants({ app: 'shop_app', worker: 'shop_worker', dashboard: 'shop_ops' }).trimEnd());
  });

  it('nobody but the migrator may CREATE in schema outlive', async () => {
    for (const pool of [asApp, asWorker, asDashboard, asOther]) {
      expect(await refused(pool, `CREATE TABLE outlive.planted (n int)`)).toMatch(/permission denied for schema outlive/);
      expect(await refused(pool, `CREATE FUNCTION outlive.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT now()'`)).toMatch(/permission denied for schema outlive/);
    }
    expect(await refused(asOther, `SELECT count(*) FROM outlive.tasks`)).toMatch(/permission denied for schema outlive/);
    await asMigrator.query(`CREATE TABLE outlive.planted (n int)`);
    await asMigrator.query(`DROP TABLE outlive.planted`);
  });

  it('covers every table, sequence and callable function of the schema', async () => {
    const tables = (await root.query<{ t: string }>(`SELECT relname::text AS t FROM pg_class WHERE relnamespace = 'outlive'::regnamespace AND relkind = 'r' ORDER BY 1`)).rows.map((r) => r.t);
    expect(tables.filter((t) => t !== 'migrations')).toEqual(Object.keys(TABLE_PRIVILEGES).sort());
    const sequences = (await root.query<{ s: string }>(`SELECT relname::text AS s FROM pg_class WHERE relnamespace = 'outlive'::regnamespace AND relkind = 'S' ORDER BY 1`)).rows.map((r) => r.s);
    expect(sequences.filter((s) => s !== 'migrations_id_seq')).toEqual(Object.keys(SEQUENCE_USERS).sort());
    const functions = (
      await root.query<{ f: string }>(
        `SELECT oid::regprocedure::text AS f FROM pg_proc WHERE pronamespace = 'outlive'::regnamespace AND prorettype <> 'trigger'::regtype ORDER BY 1`,
      )
    ).rows.map((r) => r.f);
    const named = await Promise.all(Object.keys(FUNCTION_CALLERS).map(async (f) => (await root.query(`SELECT $1::regprocedure::text AS f`, [`outlive.${f}`])).rows[0].f));
    expect(functions).toEqual(named.sort());
  });

  it('refuses, changing nothing, when run by another role than the owner, or given the owner, a superuser or no such role', async () => {
    expect(() => grants({})).toThrow(/name at least one role/);
    expect(() => grants({ app: '' })).toThrow(/the app role must be a role's name of 1-63 bytes/);
    expect(() => grants({ worker: 'x'.repeat(64) })).toThrow(/the worker role must be/);
    const before = await privileges();
    const cases: [pg.Pool, string, RegExp][] = [
      [asOther, grants(ROLES), new RegExp(`run these as ${migrator.name}, the owner of schema outlive, not as ${other.name}`)],
      [asMigrator, grants({ ...ROLES, dashboard: migrator.name }), new RegExp(`role "${migrator.name}" owns schema outlive`)],
      [asMigrator, grants({ ...ROLES, worker: 'postgres' }), /role "postgres" is a superuser, which no grant limits/],
      [asMigrator, grants({ ...ROLES, app: `${app.name}_missing` }), new RegExp(`role "${app.name}_missing" does not exist`)],
    ];
    for (const [pool, sql, message] of cases) {
      const c = await pool.connect();
      try {
        await expect(c.query(sql)).rejects.toThrow(message);
        await c.query('ROLLBACK');
      } finally {
        c.release();
      }
    }
    expect(await privileges()).toEqual(before);
    // A role of any name, quoted as SQL quotes it.
    expect(grants({ app: 'Shop "App"' })).toContain(`GRANT USAGE ON SCHEMA outlive TO ${ident('Shop "App"')};`);
  });
});
