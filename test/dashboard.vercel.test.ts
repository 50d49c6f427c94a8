/**
 * The dashboard as a Vercel route: the handler `api/dashboard.ts` re-exports,
 * over Neon's driver (through the WebSocket proxy) and a real database; the
 * Worker's dashboard test runs it over node-postgres.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { enqueue, tick } from '../src/index.js';
import { createDashboardRoute } from '../src/http/vercel.js';
import type { FunctionsEnv } from '../src/http/invocation.js';
import { freshDb } from './support/db.js';
import { roleUrl } from './support/functions-db.js';
import { startWsProxy } from './support/ws-proxy.js';
import { explode, tasks } from './fixtures/cli-tasks.js';

const db = await freshDb();
const { url: databaseUrl, password } = await roleUrl(db);
const target = new URL(db.url);
const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
afterAll(() => proxy.close());
const TOKEN = 'vercel-dashboard-token-0123456789';
const lines: string[] = [];
const env: FunctionsEnv = { DATABASE_URL: databaseUrl, NEON_WS_PROXY: proxy.address, OUTLIVE_DASHBOARD_TOKEN: TOKEN };
const route = createDashboardRoute(() => tasks, { env, write: (l) => lines.push(l) });
const at = (path: string, init: RequestInit = {}) => new Request(`https://app.example/api/dashboard${path}`, init);

describe('the Vercel dashboard route', () => {
  it('refuses without the token; shows and retries a failure with it', async () => {
    const t = await enqueue(db.pool, explode, { why: 'vercel' });
    await tick(db.pool, { tasks });
    expect((await route(at('/'))).status).toBe(401);

    const bearer = { authorization: `Bearer ${TOKEN}` };
    const page = await route(at('/', { headers: bearer }));
    expect(page.status).toBe(200);
    const body = await page.text();
    expect(body).toContain(`href="/api/dashboard/tasks/${t.id}"`);
    expect(body).toContain('boom: vercel');

    const retried = await route(at(`/tasks/${t.id}/retry`, { method: 'POST', headers: bearer, body: '' }));
    expect(retried.status).toBe(303);
    expect(retried.headers.get('location')).toBe(`/api/dashboard/tasks/${t.id}?flash=task-retried`);
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [t.id])).toEqual([{ state: 'pending' }]);

    // Prometheus's scrape, over Neon's driver: the snapshot's transaction and its reads work for the app's role.
    const metrics = await route(at('/metrics', { headers: bearer }));
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toMatch(/^outlive_queue_depth\{queue="default",state="ready"\} 1$/m);
    expect((await route(at('/metrics'))).status).toBe(401);

    const off = createDashboardRoute(() => tasks, { env: { ...env, OUTLIVE_DASHBOARD_TOKEN: '' } });
    const disabled = await off(at('/', { headers: bearer }));
    expect(disabled.status).toBe(401);
    expect(await disabled.text()).not.toContain('boom');
    expect(lines.join('\n')).not.toContain(password);
  });

  it('lists ready tasks no pass knows, by name, on the overview', async () => {
    await db.pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'from-a-newer-deploy', '{}', 3, 1000 FROM generate_series(1, 3)`);
    await tick(db.pool, { tasks });
    const body = await (await route(at('/', { headers: { authorization: `Bearer ${TOKEN}` } }))).text();
    expect(body).toMatch(/<tr data-name="from-a-newer-deploy"><td>from-a-newer-deploy<\/td><td>3<\/td><td>no pass that ran knows task &quot;from-a-newer-deploy&quot;/);
    await db.pool.query(`DELETE FROM outlive.tasks WHERE name = 'from-a-newer-deploy'`);
  });

  it('logs a database error as one JSON line whose error is the message, not JSON inside JSON', async () => {
    const said: string[] = [];
    const broken = Object.assign(new URL(databaseUrl), { pathname: '/no_such_database' }).toString();
    const failing = createDashboardRoute(() => tasks, { env: { ...env, DATABASE_URL: broken }, write: (l) => said.push(l) });
    const res = await failing(at('/', { headers: { authorization: `Bearer ${TOKEN}` } }));
    expect(res.status).toBe(500);
    expect(await res.text()).toContain('The database did not answer');
    const logged = said.map((l) => JSON.parse(l) as { outlive: string; error: string }).filter((l) => l.outlive === 'dashboard-error');
    expect(logged).toHaveLength(1);
    expect(logged[0]!.error).toMatch(/no_such_database/);
    expect(logged[0]!.error.trimStart().startsWith('{')).toBe(false);
    expect(said.join('\n')).not.toContain(password);
  });
});
