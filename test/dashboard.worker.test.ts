/**
 * The dashboard as a route of the Cloudflare Worker: functions/cloudflare.ts
 * bundled and run in Miniflare (workerd), reading the real database with
 * node-postgres through a Hyperdrive binding.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { startRun, step } from '../src/index.js';
import { freshDb } from './support/db.js';
import { roleUrl } from './support/functions-db.js';
import { bundleWorker, startWorker, workerDatabase } from './support/worker.js';
import { greet } from './fixtures/cli-tasks.js';

const db = await freshDb();
const { url: databaseUrl, password } = await roleUrl(db);
const database = await workerDatabase('hyperdrive', databaseUrl);
const TOKEN = 'worker-dashboard-token-0123456789';
const worker = await startWorker(await bundleWorker(), { ...database.bindings, OUTLIVE_DASHBOARD_TOKEN: TOKEN }, database.options);

afterAll(async () => {
  await worker.dispose();
  await database.close();
});

describe('the Worker serves the dashboard', () => {
  it('answers 401 without the token, and the pages with it', async () => {
    const run = await startRun(db.pool, 'worker run', { a: step(greet, { name: 'a' }), b: step(greet, { name: 'b' }, { after: ['a'] }) });
    const bare = await worker.fetch('/dashboard');
    expect(bare.status).toBe(401);
    expect(await bare.text()).not.toContain('worker run');

    const login = await worker.fetch(`/dashboard/?token=${TOKEN}`, { redirect: 'manual' });
    expect(login.status).toBe(303);
    expect(login.headers.get('location')).toBe('/dashboard/');
    const cookie = login.headers.get('set-cookie')!;
    expect(cookie).toMatch(/^outlive_dashboard=\d+\.[0-9a-f]{32}\.[0-9a-f]{64}; Path=\/dashboard; HttpOnly; SameSite=Strict/);

    const overview = await worker.fetch('/dashboard/', { headers: { cookie: cookie.split(';')[0]! } });
    expect(overview.status).toBe(200);
    const body = await overview.text();
    expect(body).toContain('worker run');
    expect(body).toMatch(/<span class="progress">0 of 2<\/span>/);

    const runPage = await (await worker.fetch(`/dashboard/runs/${run.id}`, { headers: { authorization: `Bearer ${TOKEN}` } })).text();
    expect(runPage).toMatch(/data-state="pending" data-step="b"/);
    expect(runPage).toContain('waiting for &quot;a&quot; to succeed');
    const metrics = await worker.fetch('/dashboard/metrics', { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    expect(await metrics.text()).toContain('outlive_queue_depth{queue="default",state="ready"} 1\n');
    expect((await worker.fetch('/dashboard/metrics')).status).toBe(401);
    // The drain route is still there, and nothing else.
    expect((await worker.fetch('/elsewhere')).status).toBe(404);
    expect(worker.output()).not.toContain(TOKEN);
    expect(worker.output()).not.toContain(password);
  });
});
