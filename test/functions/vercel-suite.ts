/**
 * The Vercel routes, called as Web `Request` to `Response` handlers in Node,
 * against the real PostgreSQL; and the nudge, sent over real HTTP to the
 * drain route. One suite, run once per driver (`vercel.pg.test.ts`:
 * node-postgres, the default on the Node.js runtime for any Postgres;
 * `vercel.neon.test.ts`: Neon's WebSocket driver through a proxy). A pass
 * must behave the same either way.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Cron } from 'croner';
import { z } from 'zod';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { enqueue } from '../../src/write/enqueue.js';
import { defineSchedule } from '../../src/maintenance/schedule.js';
import { defineTask } from '../../src/model/task.js';
import { NonRetriableError } from '../../src/model/errors.js';
import { nudge, signNudge, SIGNATURE_HEADER } from '../../src/http/nudge.js';
import { createCronRoute, createDrainRoute, VERCEL_MAX_DURATION_S, vercelBudgetMs } from '../../src/http/vercel.js';
import type { FunctionsEnv } from '../../src/http/invocation.js';
import type { DriverName } from '../../src/db/connect.js';
import { ping } from '../../functions/tasks.js';
import { freshDb } from '../support/db.js';
import { definitions, tasks } from '../support/function-tasks.js';
import { roleUrl, waitFor } from '../support/functions-db.js';
import { createEffects, taskRow } from '../support/tasks.js';
import { startTcpProxy } from '../support/tcp-proxy.js';
import { startWsProxy } from '../support/ws-proxy.js';

/** Declares the suite for one driver; call it at the top level of a test file. */
export async function vercelSuite(driver: DriverName): Promise<void> {
  const db = await freshDb();
  await createEffects(db.pool);
  const { url: roleDatabaseUrl, password } = await roleUrl(db);
  const target = new URL(db.url);
  // The last hop to the server counts connections, so a test can see a pool close:
  // a WebSocket proxy for Neon's driver, a TCP proxy for node-postgres.
  const wsProxy = driver === 'neon' ? await startWsProxy(`${target.hostname}:${target.port || 5432}`) : null;
  const tcpProxy = driver === 'pg' ? await startTcpProxy(target.hostname, Number(target.port || 5432)) : null;
  const proxy = {
    get open() {
      return (wsProxy ?? tcpProxy)!.open;
    },
  };
  const databaseUrl = tcpProxy ? tcpProxy.url(roleDatabaseUrl) : roleDatabaseUrl;
  afterAll(async () => {
    await wsProxy?.close();
    await tcpProxy?.close();
  });

  const SECRET = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
  const CRON_SECRET = `cron-${crypto.randomUUID()}`;
  /** Where the tests' drain requests arrive: the endpoint their signatures are for. */
  const DRAIN_URL = 'https://app.example/api/drain';
  const env: FunctionsEnv = {
    DATABASE_URL: databaseUrl,
    // Off Vercel (no VERCEL=1) the request's Host is the client's: the drain must be told its URL.
    OUTLIVE_DRAIN_URL: DRAIN_URL,
    ...(wsProxy ? { NEON_WS_PROXY: wsProxy.address } : {}),
    OUTLIVE_DRAIN_SECRET: SECRET,
    CRON_SECRET,
    OUTLIVE_BUDGET_MS: '10000',
  };
  const lines: string[] = [];
  const bodies: string[] = [];
  const write = (line: string) => lines.push(line);
  const GET = createCronRoute(tasks, { env, write });
  const POST = createDrainRoute(tasks, { env, write });
  const defs = definitions(null);

  /** The budgets of the passes logged since line `from`, in order. */
  function budgetsLogged(from: number): { trigger: string; budgetMs: number }[] {
    return lines
      .slice(from)
      .filter((l) => l.includes('"outlive":"pass"'))
      .map((l) => JSON.parse(l) as { trigger: string; budgetMs: number })
      .map(({ trigger, budgetMs }) => ({ trigger, budgetMs }));
  }

  /**
   * Runs `body` inside what Vercel's runtime gives each invocation: a request
   * context (the global that `@vercel/functions` reads) with its `waitUntil`
   * and the invocation's deadline. Returns the work handed to `waitUntil`.
   */
  async function onVercel(deadline: Date, body: () => Promise<void>): Promise<Promise<unknown>[]> {
    const handed: Promise<unknown>[] = [];
    const key = Symbol.for('@vercel/request-context');
    const context = { waitUntil: (work: Promise<unknown>) => void handed.push(work), deadline: deadline.toISOString() };
    (globalThis as Record<symbol, unknown>)[key] = { get: () => context };
    try {
      await body();
    } finally {
      delete (globalThis as Record<symbol, unknown>)[key];
    }
    return handed;
  }

  async function call(handler: (r: Request) => Promise<Response>, request: Request) {
    const response = await handler(request);
    const body = await response.text();
    bodies.push(body);
    return { status: response.status, headers: response.headers, json: JSON.parse(body) };
  }

  const cronRequest = (authorization?: string) =>
    new Request('https://app.example/api/cron', { headers: authorization ? { authorization } : {} });

  async function drainRequest(body = '', signature?: string, headers: Record<string, string> = {}) {
    return new Request(DRAIN_URL, {
      method: 'POST',
      headers: { [SIGNATURE_HEADER]: signature ?? (await signNudge(SECRET, DRAIN_URL, body)), ...headers },
      body,
    });
  }

  describe('the Vercel cron route (GET, Bearer CRON_SECRET)', () => {
    it('refuses a missing or wrong secret with 401 and runs nothing', async () => {
      const t = await enqueue(db.pool, defs.record, { n: 1 });
      for (const auth of [undefined, 'Bearer wrong', `Basic ${CRON_SECRET}`, `Bearer ${CRON_SECRET}x`, `Bearer ${CRON_SECRET.slice(0, -1)}`]) {
        const res = await call(GET, cronRequest(auth));
        expect({ auth, status: res.status }).toEqual({ auth, status: 401 });
      }
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'pending', attempts: 0 });
    });

    it('runs recovery, then a bounded pass, and answers with its report', async () => {
      const dead = await enqueue(db.pool, defs.record, { n: 2 });
      await db.pool.query(
        `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = now() - interval '1 second' WHERE id = $1`,
        [dead.id],
      );
      const res = await call(GET, cronRequest(`Bearer ${CRON_SECRET}`));
      expect(res.status).toBe(200);
      expect(res.json.report).toMatchObject({ recovered: 1, failed: 0, stoppedBy: 'drained' });
      expect(res.json.report.claimed).toBeGreaterThanOrEqual(1); // the task left pending by the test above
      expect(res.json.report.owner).toMatch(/^vercel:cron:/);
      // The pass went through the driver this suite is about.
      expect(lines.filter((l) => l.includes('"outlive":"pass"')).at(-1)).toContain(`"driver":"${driver}"`);
      expect(await taskRow(db.pool, dead.id)).toMatchObject({ state: 'pending', attempts: 1 });
    });

    it('fires the schedules that are due, once per slot, and runs their tasks in the same tick', async () => {
      const every = defineSchedule({ name: 'fn-every-minute', cron: '* * * * *', task: defs.record, input: (slot) => ({ n: slot.getUTCMinutes() + 1000 }) });
      const withSchedules = createCronRoute((deps) => ({ tasks: tasks(deps) as never, schedules: [every] }), { env, write });
      // The first tick registers the schedule; it fires from its next slot.
      expect((await call(withSchedules, cronRequest(`Bearer ${CRON_SECRET}`))).status).toBe(200);
      const [row] = await db.rows<{ next_slot: Date }>(`SELECT next_slot FROM outlive.schedules WHERE name = 'fn-every-minute'`);
      expect(row!.next_slot.getTime()).toBeGreaterThan(Date.now() - 1_000);
      // Make its slot a minute overdue: two overlapping ticks enqueue it once.
      await db.pool.query(`UPDATE outlive.schedules SET next_slot = date_trunc('minute', now()) - interval '1 minute' WHERE name = 'fn-every-minute'`);
      const [a, b] = await Promise.all([
        call(withSchedules, cronRequest(`Bearer ${CRON_SECRET}`)),
        call(withSchedules, cronRequest(`Bearer ${CRON_SECRET}`)),
      ]);
      expect([a.status, b.status]).toEqual([200, 200]);
      const fired = await db.rows<{ state: string }>(
        `SELECT t.state::text FROM outlive.schedule_slots s JOIN outlive.tasks t ON t.id = s.task_id WHERE s.schedule = 'fn-every-minute'`,
      );
      expect(fired).toEqual([{ state: 'succeeded' }]);
      expect(lines.some((l) => l.includes('"outlive":"schedules"'))).toBe(true);
    });

    it('refuses to run without a configured CRON_SECRET', async () => {
      const open = createCronRoute(tasks, { env: { ...env, CRON_SECRET: '' }, write });
      const res = await call(open, cronRequest('Bearer '));
      expect(res.status).toBe(500);
    });

    it('caps a budget above the platform ceiling', async () => {
      const ceiling = vercelBudgetMs(VERCEL_MAX_DURATION_S);
      const greedy = createCronRoute(tasks, { env: { ...env, OUTLIVE_BUDGET_MS: String(ceiling * 10) }, write });
      const res = await call(greedy, cronRequest(`Bearer ${CRON_SECRET}`));
      expect(res.status).toBe(200);
      expect(lines.some((l) => l.includes('"budget-capped"') && l.includes(`"budgetMs":${ceiling}`))).toBe(true);
    });
  });

  describe('the budget of a pass on Vercel', () => {
    it('is maxDuration less a cold start and a tenth, when Vercel does not tell the deadline', () => {
      // 60 s (vercel.json): 10 s for a cold start, then a tenth of the 50 s left (5 s) for the last settles.
      expect(vercelBudgetMs(60)).toBe(45_000);
      expect(vercelBudgetMs(300)).toBe(261_000); // Hobby's largest maxDuration
      expect(vercelBudgetMs(800)).toBe(711_000); // Pro's largest without the beta
    });

    it('follows the invocation\'s deadline when Vercel gives one, whatever maxDuration the route assumes', () => {
      const now = Date.parse('2026-01-01T00:00:00Z');
      expect(vercelBudgetMs(60, new Date(now + 30_000), now)).toBe(25_000);
      expect(vercelBudgetMs(60, new Date(now + 300_000), now)).toBe(270_000);
      expect(vercelBudgetMs(60, new Date(now + 4_000), now)).toBe(2_000);
      // A deadline already passed (or too close to run anything) still gives a budget of at least 1 ms.
      expect(vercelBudgetMs(60, new Date(now - 1_000), now)).toBe(1);
    });

    it('is what each route\'s pass gets, the drain in waitUntil included: its work shares maxDuration', async () => {
      const open: FunctionsEnv = { ...env, OUTLIVE_BUDGET_MS: '' };
      const pending: Promise<unknown>[] = [];
      const from = lines.length;
      expect((await call(createCronRoute(tasks, { env: open, write }), cronRequest(`Bearer ${CRON_SECRET}`))).status).toBe(200);
      const drainRoute = createDrainRoute(tasks, { env: open, write, waitUntil: (work) => void pending.push(work) });
      expect((await call(drainRoute, await drainRequest())).status).toBe(200);
      expect((await call(drainRoute, await drainRequest('', undefined, { prefer: 'respond-async' }))).status).toBe(202);
      await Promise.all(pending);
      const longer = createCronRoute(tasks, { env: open, write, maxDuration: 300 });
      expect((await call(longer, cronRequest(`Bearer ${CRON_SECRET}`))).status).toBe(200);
      expect(budgetsLogged(from)).toEqual([
        { trigger: 'cron', budgetMs: 45_000 },
        { trigger: 'drain', budgetMs: 45_000 },
        { trigger: 'drain', budgetMs: 45_000 },
        { trigger: 'cron', budgetMs: 261_000 },
      ]);
    });

    it('may be lowered by OUTLIVE_BUDGET_MS, never raised', async () => {
      const from = lines.length;
      const lower = createCronRoute(tasks, { env: { ...env, OUTLIVE_BUDGET_MS: '3000' }, write, maxDuration: 300 });
      expect((await call(lower, cronRequest(`Bearer ${CRON_SECRET}`))).status).toBe(200);
      const higher = createCronRoute(tasks, { env: { ...env, OUTLIVE_BUDGET_MS: '400000' }, write, maxDuration: 300 });
      expect((await call(higher, cronRequest(`Bearer ${CRON_SECRET}`))).status).toBe(200);
      expect(budgetsLogged(from)).toEqual([
        { trigger: 'cron', budgetMs: 3_000 },
        { trigger: 'cron', budgetMs: 261_000 },
      ]);
      expect(lines.slice(from).some((l) => l.includes('"budget-capped"') && l.includes('"requestedMs":400000'))).toBe(true);
    });
  });

  describe('the Vercel drain route (POST, signed)', () => {
    it('answers a nudge at once (202) and runs the pass in waitUntil, then closes its pool', async () => {
      const pending: Promise<unknown>[] = [];
      const route = createDrainRoute(tasks, { env, write, waitUntil: (work) => void pending.push(work) });
      const t = await enqueue(db.pool, defs.record, { n: 10, sleepMs: 300 });
      const res = await call(route, await drainRequest('', undefined, { prefer: 'respond-async' }));
      expect(res.status).toBe(202);
      expect(res.headers.get('preference-applied')).toBe('respond-async');
      // The pass and the pool's close, both left to run after the response.
      expect(pending.length).toBeGreaterThanOrEqual(2);
      await Promise.all(pending);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded', attempts: 1 });
      await waitFor(async () => proxy.open === 0, 20_000, 'the pool to close');
    });

    it('still answers with the report when the request does not ask to answer at once', async () => {
      const pending: Promise<unknown>[] = [];
      const route = createDrainRoute(tasks, { env, write, waitUntil: (work) => void pending.push(work) });
      const t = await enqueue(db.pool, defs.record, { n: 11 });
      const res = await call(route, await drainRequest());
      expect(res.status).toBe(200);
      expect(res.json.report.succeeded).toBeGreaterThanOrEqual(1);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
      await Promise.all(pending);
    });

    it('reads the request context where @vercel/functions reads it: the context these tests make is the one Vercel gives', async () => {
      const deadline = new Date(Date.now() + 42_000);
      let got: { deadline?: Date; handed: number } = { handed: 0 };
      const handed = await onVercel(deadline, async () => {
        const fns = await import('@vercel/functions');
        fns.waitUntil(Promise.resolve());
        got = { deadline: fns.getDeadline(), handed: 0 };
      });
      got.handed = handed.length;
      expect(got).toEqual({ deadline, handed: 1 });
    });

    it('uses Vercel\'s waitUntil and deadline when deployed on Vercel', async () => {
      const route = createDrainRoute(tasks, { env: { ...env, VERCEL: '1', OUTLIVE_BUDGET_MS: '' }, write });
      const t = await enqueue(db.pool, defs.record, { n: 12, sleepMs: 300 });
      const from = lines.length;
      let status = 0;
      const handed = await onVercel(new Date(Date.now() + 30_000), async () => {
        status = (await call(route, await drainRequest('', undefined, { prefer: 'respond-async' }))).status;
      });
      expect(status).toBe(202);
      expect(handed.length).toBeGreaterThanOrEqual(2);
      await Promise.all(handed);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
      // The budget follows the deadline Vercel gave the invocation: the 30 s left, less 5 s kept back.
      const [pass] = budgetsLogged(from);
      expect(pass!.budgetMs).toBeGreaterThan(23_000);
      expect(pass!.budgetMs).toBeLessThanOrEqual(25_000);
    });

    it('on Vercel without a request context, answers when its pass is done, and says why once', async () => {
      vi.resetModules(); // a fresh module: it says why once per instance
      try {
        const fresh = await import('../../src/http/vercel.js');
        const said: string[] = [];
        const route = fresh.createDrainRoute(tasks, { env: { ...env, VERCEL: '1' }, write: (line) => said.push(line) });
        const t = await enqueue(db.pool, defs.record, { n: 13 });
        const first = await call(route, await drainRequest('', undefined, { prefer: 'respond-async' }));
        expect(first.status).toBe(200);
        expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
        expect((await call(route, await drainRequest('', undefined, { prefer: 'respond-async' }))).status).toBe(200);
        expect(said.filter((l) => l.includes('"outlive":"vercel-context-missing"'))).toHaveLength(1);
      } finally {
        vi.resetModules();
      }
    });

    it('runs the pass before answering, even when asked to answer at once, where nothing can wait for it', async () => {
      const t = await enqueue(db.pool, defs.record, { n: 3 });
      const res = await call(POST, await drainRequest('', undefined, { prefer: 'respond-async' }));
      expect(res.status).toBe(200);
      expect(res.headers.get('preference-applied')).toBeNull();
      // At least this test's task (the task recovered above may come due meanwhile).
      expect(res.json.report.succeeded).toBeGreaterThanOrEqual(1);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
    });

    it('drains only the queues the signed body names', async () => {
      const mail = await enqueue(db.pool, defs.record, { n: 4 }, { queue: 'mail' });
      const other = await enqueue(db.pool, defs.record, { n: 5 }, { queue: 'other' });
      const body = JSON.stringify({ queues: ['mail'] });
      const res = await call(POST, await drainRequest(body));
      expect(res.status).toBe(200);
      expect(await taskRow(db.pool, mail.id)).toMatchObject({ state: 'succeeded' });
      expect(await taskRow(db.pool, other.id)).toMatchObject({ state: 'pending' });
      const bad = await call(POST, await drainRequest(JSON.stringify({ queues: ['no spaces allowed'] })));
      expect(bad.status).toBe(400);
      await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', finished_at = now() WHERE id = $1`, [other.id]);
    });

    it('refuses unsigned, wrong and replayed requests and runs nothing', async () => {
      const t = await enqueue(db.pool, defs.record, { n: 6 });
      const unsigned = await call(POST, new Request(DRAIN_URL, { method: 'POST', body: '' }));
      expect(unsigned.status).toBe(401);
      expect(unsigned.headers.get('www-authenticate')).toBe(SIGNATURE_HEADER);
      expect((await call(POST, await drainRequest('', await signNudge('y'.repeat(40), DRAIN_URL, '')))).status).toBe(401);
      const signature = await signNudge(SECRET, DRAIN_URL, '{}');
      expect((await call(POST, await drainRequest('{}', signature))).status).toBe(200); // spends it, drains t
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
      const u = await enqueue(db.pool, defs.record, { n: 7 });
      expect((await call(POST, await drainRequest('{}', signature))).status).toBe(403);
      expect(await taskRow(db.pool, u.id)).toMatchObject({ state: 'pending', attempts: 0 });
      expect((await call(POST, new Request(DRAIN_URL))).status).toBe(405);
    });

    it('refuses a body too large to be a nudge before reading it all or touching the database', async () => {
      const big = JSON.stringify({ queues: ['default'], padding: 'x'.repeat(70_000) });
      const res = await call(POST, await drainRequest(big));
      expect(res.status).toBe(413);
    });
  });

  describe('the nudge', () => {
    /** A drain route served over real HTTP, as an app on another platform reaches it. */
    const serve = (route: (request: Request) => Promise<Response>) =>
      createServer(async (req, res) => {
        const chunks: Buffer[] = [];
        for await (const chunk of req) chunks.push(chunk as Buffer);
        const headers = new Headers();
        for (const [k, v] of Object.entries(req.headers)) if (typeof v === 'string') headers.set(k, v);
        // The URL the nudge was sent to (host and port included): the endpoint its signature is for.
        const response = await route(
          new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers, body: req.method === 'POST' ? Buffer.concat(chunks) : null }),
        );
        const body = await response.text();
        bodies.push(body);
        const out: Record<string, string> = {};
        response.headers.forEach((value, key) => (out[key] = value));
        res.writeHead(response.status, out);
        res.end(body);
      });
    const server = serve(POST);
    const listening = new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const drainUrl = async () => {
      await listening;
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/drain`;
      env.OUTLIVE_DRAIN_URL = `${DRAIN_URL},${url}`;
      return url;
    };

    it('is signed and sent after commit; the task has run when it returns', async () => {
      const client = await db.pool.connect();
      let id: string;
      try {
        await client.query('BEGIN');
        id = (await enqueue(client, defs.record, { n: 8 })).id;
        await client.query('COMMIT');
      } finally {
        client.release();
      }
      const result = await nudge(await drainUrl(), SECRET, { queues: ['default'] });
      expect(result).toEqual({ delivered: true, status: 200 });
      expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded' });
    });

    it('is delivered at once when the drain runs in waitUntil, however long the pass (longer than the nudge\'s 5 s)', async () => {
      // Three tasks of 2 s, one at a time: a pass of about 6 s.
      const slowWork: Promise<unknown>[] = [];
      const slowEnv: FunctionsEnv = { ...env, OUTLIVE_CONCURRENCY: '1' };
      const slow = createDrainRoute(tasks, { env: slowEnv, write, waitUntil: (work) => void slowWork.push(work) });
      const slowServer = serve(slow);
      await new Promise<void>((resolve) => slowServer.listen(0, '127.0.0.1', resolve));
      slowEnv.OUTLIVE_DRAIN_URL = `http://127.0.0.1:${(slowServer.address() as AddressInfo).port}/api/drain`;
      try {
        const ids = (await Promise.all([20, 21, 22].map((n) => enqueue(db.pool, defs.record, { n, sleepMs: 2_000 })))).map((t) => t.id);
        const started = Date.now();
        const result = await nudge(`http://127.0.0.1:${(slowServer.address() as AddressInfo).port}/api/drain`, SECRET);
        expect(result).toEqual({ delivered: true, status: 202 });
        expect(Date.now() - started).toBeLessThan(4_000);
        await Promise.all(slowWork);
        for (const id of ids) expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded' });
      } finally {
        await new Promise<void>((resolve) => slowServer.close(() => resolve()));
      }
    }, 30_000);

    it('may be lost without harm: it reports the loss, and the next cron tick runs the task', async () => {
      const t = await enqueue(db.pool, defs.record, { n: 9 });
      const closed = createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      const port = (closed.address() as AddressInfo).port;
      await new Promise<void>((resolve) => closed.close(() => resolve()));
      const lost = await nudge(`http://127.0.0.1:${port}/api/drain`, SECRET);
      expect(lost.delivered).toBe(false);
      expect(lost.status).toBeNull();
      expect(lost.error).toBeInstanceOf(Error);
      const refused = await nudge(await drainUrl(), 'z'.repeat(40));
      expect(refused).toMatchObject({ delivered: false, status: 401 });
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'pending' });

      const res = await call(GET, cronRequest(`Bearer ${CRON_SECRET}`));
      expect(res.status).toBe(200);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
    });

    it('throws only for configuration mistakes', async () => {
      await expect(nudge(await drainUrl(), 'short')).rejects.toThrow(/at least 32 characters/);
      await expect(nudge('/api/drain', SECRET)).rejects.toThrow(/absolute URL/);
    });
  });

  describe('the files Vercel deploys (api/)', () => {
    it('re-export the routes bound to the app\'s tasks, reading process.env', async () => {
      // Tasks left by the tests above (the one recovered there comes due after
      // its backoff) are of tasks the deployed routes do not know, so a pass
      // here would fail them: it failed one in a slow CI run.
      await db.pool.query(`DELETE FROM outlive.tasks WHERE state IN ('pending', 'running')`);
      const saved = { ...process.env };
      Object.assign(process.env, env);
      try {
        const { POST: deployedPost } = await import('../../api/drain.js');
        const { GET: deployedGet } = await import('../../api/cron.js');
        const t = await enqueue(db.pool, ping, { message: 'hello' });
        const drained = await deployedPost(await drainRequest());
        expect(drained.status).toBe(200);
        expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded', output: { pong: 'hello' } });
        const ticked = await deployedGet(cronRequest(`Bearer ${CRON_SECRET}`));
        expect(ticked.status).toBe(200);
        expect(await ticked.json()).toMatchObject({ report: { failed: 0 } });
      } finally {
        for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
        Object.assign(process.env, saved);
      }
    });
  });

  describe('vercel.json', () => {
    const root = new URL('../../', import.meta.url);
    const config = JSON.parse(readFileSync(new URL('vercel.json', root), 'utf8')) as {
      functions: Record<string, { maxDuration: number }>;
      crons: { path: string; schedule: string }[];
    };
    const deploy = readFileSync(new URL('docs/deploy.md', root), 'utf8');
    const vercelSection = deploy.slice(deploy.indexOf('## Deploy to Vercel'), deploy.indexOf('\n## ', deploy.indexOf('## Deploy to Vercel') + 1));

    /** How many times a schedule fires on each UTC day it fires, over the next year. */
    function firingsPerDay(schedule: string): number[] {
      const runs = new Cron(schedule, { timezone: 'UTC', paused: true }).nextRuns(800, new Date('2027-01-01T00:00:00Z'));
      const days = new Map<string, number>();
      for (const run of runs) {
        if (run.getTime() >= Date.parse('2028-01-01T00:00:00Z')) break;
        const day = run.toISOString().slice(0, 10);
        days.set(day, (days.get(day) ?? 0) + 1);
      }
      return [...days.values()];
    }

    it('deploys on the Hobby plan: each cron runs at most once a day, as docs/deploy.md says', () => {
      expect(config.crons).toEqual([{ path: '/api/cron', schedule: expect.any(String) }]);
      for (const { schedule } of config.crons) {
        const perDay = firingsPerDay(schedule);
        expect(perDay.length).toBeGreaterThan(300); // it does fire, about daily
        expect(Math.max(...perDay)).toBe(1);
        expect(vercelSection).toContain(`"schedule": "${schedule}"`);
      }
      expect(vercelSection).toMatch(/Hobby/);
    });

    it('documents the Pro variant: the same cron every minute', () => {
      expect(vercelSection).toContain('"schedule": "* * * * *"');
      expect(vercelSection).toMatch(/Pro/);
    });

    it('gives the routes the maxDuration they assume, which every plan allows (at most 300 s on Hobby)', () => {
      expect(config.functions['api/*.ts']!.maxDuration).toBe(VERCEL_MAX_DURATION_S);
      expect(VERCEL_MAX_DURATION_S).toBeLessThanOrEqual(300);
    });
  });

  describe('a database that cannot be reached', () => {
    it('is logged as what happened, never as an object dumped or an empty message', async () => {
      // Nothing listens on port 1: node-postgres is refused there; Neon's
      // driver cannot open its WebSocket (an ErrorEvent on Node 22+).
      const unreachable: FunctionsEnv =
        driver === 'pg'
          ? { ...env, DATABASE_URL: Object.assign(new URL(databaseUrl), { port: '1' }).toString() }
          : { ...env, NEON_WS_PROXY: '127.0.0.1:1/v1' };
      const said: string[] = [];
      const route = createCronRoute(tasks, { env: unreachable, write: (l) => said.push(l) });
      const res = await call(route, cronRequest(`Bearer ${CRON_SECRET}`));
      expect(res.status).toBe(500);
      const failed = said.find((l) => l.includes('"outlive":"pass-failed"'));
      expect(failed, said.join('\n')).toBeDefined();
      const { error } = JSON.parse(failed!) as { error: string };
      expect(error).toMatch(driver === 'pg' ? /ECONNREFUSED/ : /ECONNREFUSED|network error|WebSocket|connect/i);
      expect(error).not.toMatch(/non-Error thrown|\{\}/);
      for (const line of said) {
        expect(line.length).toBeLessThan(1_000);
        expect(line).not.toMatch(/secretKey|processID/);
        for (const secret of [SECRET, CRON_SECRET, password]) expect(line.includes(secret)).toBe(false);
      }
    });
  });

  describe('secrets', () => {
    it('are blanked out of the errors a drained task stores in its row, as they are in the log', async () => {
      const DASHBOARD_TOKEN = `dash-${crypto.randomUUID()}`;
      const leaky = defineTask({
        name: 'fn-leaky',
        input: z.object({}),
        timeoutMs: 1_000,
        retry: { maxAttempts: 2 },
        async run(_input, ctx) {
          // What a careless handler throws: the settings it failed with.
          const err = new Error(`connect ${databaseUrl} as ${password} failed; token ${DASHBOARD_TOKEN}`);
          if (ctx.attempt === 2) throw new NonRetriableError(err.message);
          throw err;
        },
      });
      const route = createDrainRoute(() => [leaky], { env: { ...env, OUTLIVE_DASHBOARD_TOKEN: DASHBOARD_TOKEN }, write });
      const t = await enqueue(db.pool, leaky, {});
      for (let attempt = 1; attempt <= 2; attempt++) {
        await db.pool.query('UPDATE outlive.tasks SET run_at = now() WHERE id = $1', [t.id]);
        const res = await call(route, await drainRequest());
        expect(res.status, JSON.stringify([res.json, lines.slice(-3)])).toBe(200);
      }
      const { rows } = await db.pool.query<{ state: string; last_error: string; errors: unknown }>(
        'SELECT state, last_error, errors FROM outlive.tasks WHERE id = $1', [t.id],
      );
      expect(rows[0]).toMatchObject({ state: 'failed', last_error: 'connect [redacted] as [redacted] failed; token [redacted]' });
      const stored = JSON.stringify(rows[0]);
      expect(stored).toContain('[redacted]');
      for (const secret of [password, databaseUrl, DASHBOARD_TOKEN]) expect(stored.includes(secret)).toBe(false);
    });

    it('never appear in a response or a log line', async () => {
      const broken = new URL(databaseUrl);
      broken.pathname = '/no_such_database';
      const failing = createCronRoute(tasks, { env: { ...env, DATABASE_URL: broken.toString() }, write });
      const res = await call(failing, cronRequest(`Bearer ${CRON_SECRET}`));
      expect(res.status).toBe(500);
      const everything = [...lines, ...bodies].join('\n');
      expect(everything).toMatch(/"outlive":"pass"/);
      expect(everything).toMatch(/no_such_database/);
      for (const secret of [SECRET, CRON_SECRET, password, databaseUrl]) expect(everything.includes(secret)).toBe(false);
    });
  });
}
