/**
 * The Vercel routes, called as Web `Request` to `Response` handlers in Node,
 * over the Neon WebSocket driver (through the local proxy) to the real
 * PostgreSQL; and the nudge, sent over real HTTP to the drain route.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { enqueue } from '../../src/write/enqueue.js';
import { defineSchedule } from '../../src/maintenance/schedule.js';
import { nudge, signNudge, SIGNATURE_HEADER } from '../../src/http/nudge.js';
import { createCronRoute, createDrainRoute, VERCEL_BUDGET_MS } from '../../src/http/vercel.js';
import type { FunctionsEnv } from '../../src/http/invocation.js';
import { ping } from '../../functions/tasks.js';
import { freshDb } from '../support/db.js';
import { definitions, tasks } from '../support/function-tasks.js';
import { roleUrl } from '../support/functions-db.js';
import { createEffects, taskRow } from '../support/tasks.js';
import { startWsProxy } from '../support/ws-proxy.js';

const db = await freshDb();
await createEffects(db.pool);
const { url: databaseUrl, password } = await roleUrl(db);
const target = new URL(db.url);
const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
afterAll(() => proxy.close());

const SECRET = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
const CRON_SECRET = `cron-${crypto.randomUUID()}`;
const env: FunctionsEnv = {
  DATABASE_URL: databaseUrl,
  NEON_WS_PROXY: proxy.address,
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

async function call(handler: (r: Request) => Promise<Response>, request: Request) {
  const response = await handler(request);
  const body = await response.text();
  bodies.push(body);
  return { status: response.status, headers: response.headers, json: JSON.parse(body) };
}

const cronRequest = (authorization?: string) =>
  new Request('https://app.example/api/cron', { headers: authorization ? { authorization } : {} });

async function drainRequest(body = '', signature?: string, headers: Record<string, string> = {}) {
  return new Request('https://app.example/api/drain', {
    method: 'POST',
    headers: { [SIGNATURE_HEADER]: signature ?? (await signNudge(SECRET, body)), ...headers },
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
    const greedy = createCronRoute(tasks, { env: { ...env, OUTLIVE_BUDGET_MS: String(VERCEL_BUDGET_MS * 10) }, write });
    const res = await call(greedy, cronRequest(`Bearer ${CRON_SECRET}`));
    expect(res.status).toBe(200);
    expect(lines.some((l) => l.includes('"budget-capped"') && l.includes(`"budgetMs":${VERCEL_BUDGET_MS}`))).toBe(true);
  });
});

describe('the Vercel drain route (POST, signed)', () => {
  it('runs the pass before answering, even when asked to answer at once', async () => {
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
    const unsigned = await call(POST, new Request('https://app.example/api/drain', { method: 'POST', body: '' }));
    expect(unsigned.status).toBe(401);
    expect(unsigned.headers.get('www-authenticate')).toBe(SIGNATURE_HEADER);
    expect((await call(POST, await drainRequest('', await signNudge('y'.repeat(40), '')))).status).toBe(401);
    const signature = await signNudge(SECRET, '{}');
    expect((await call(POST, await drainRequest('{}', signature))).status).toBe(200); // spends it, drains t
    expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
    const u = await enqueue(db.pool, defs.record, { n: 7 });
    expect((await call(POST, await drainRequest('{}', signature))).status).toBe(403);
    expect(await taskRow(db.pool, u.id)).toMatchObject({ state: 'pending', attempts: 0 });
    expect((await call(POST, new Request('https://app.example/api/drain'))).status).toBe(405);
  });

  it('refuses a body too large to be a nudge before reading it all or touching the database', async () => {
    const big = JSON.stringify({ queues: ['default'], padding: 'x'.repeat(70_000) });
    const res = await call(POST, await drainRequest(big));
    expect(res.status).toBe(413);
  });
});

describe('the nudge', () => {
  // The drain route served over real HTTP, as an app on another platform reaches it.
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === 'string') headers.set(k, v);
    const response = await POST(
      new Request(`http://127.0.0.1${req.url}`, { method: req.method, headers, body: req.method === 'POST' ? Buffer.concat(chunks) : null }),
    );
    const body = await response.text();
    bodies.push(body);
    const out: Record<string, string> = {};
    response.headers.forEach((value, key) => (out[key] = value));
    res.writeHead(response.status, out);
    res.end(body);
  });
  const listening = new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const drainUrl = async () => {
    await listening;
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/drain`;
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

describe('secrets', () => {
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
