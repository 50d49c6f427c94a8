/**
 * The dashboard in a real browser: headless Chromium (see
 * test/support/browser.ts for which) driven by playwright-core, against the
 * dashboard's handler served on 127.0.0.1 over a real database. With OUTLIVE_SCREENSHOTS=1 it saves screenshots of the main
 * views in docs/screenshots (otherwise in a temporary folder).

 */
import { mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, setLimit, startRun, step, tick } from '../src/index.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { serveHandler } from '../scripts/local/http.js';
import { launchChromium } from './support/browser.js';
import { insertRun } from '../scripts/local/rows-at-scale.js';
import { freshDb } from './support/db.js';
import { explode, fixExplode, greet, tasks } from './fixtures/cli-tasks.js';

const db = await freshDb();
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TOKEN = 'browser-test-token-0123456789';
// The docs' screenshots are refreshed on request (OUTLIVE_SCREENSHOTS=1), so a test run leaves the tree clean.
const shots = process.env.OUTLIVE_SCREENSHOTS ? path.join(root, 'docs/screenshots') : path.join(os.tmpdir(), `outlive-screenshots-${process.pid}`);
mkdirSync(shots, { recursive: true });

const server = await serveHandler((request) => handleDashboard(request, db.pool, { token: TOKEN, basePath: '/dashboard' }));
const base = `${server.url}/dashboard`;
let browser: Browser;
let page: Page;

beforeAll(async () => {
  ({ browser } = await launchChromium());
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
});

afterAll(async () => {
  await browser?.close();
  await server.close();
});

describe('the dashboard in Chromium', () => {
  it('refuses without the token and shows nothing', async () => {
    await enqueue(db.pool, greet, { name: 'secret-name-in-a-row' });
    const bare = await page.goto(base);
    expect(bare?.status()).toBe(401);
    const text = await page.locator('body').innerText();
    expect(text).toContain('Unauthorized');
    expect(text).not.toContain('secret-name-in-a-row');
    expect(await page.locator('#task-counts').count()).toBe(0);

    const wrong = await page.goto(`${base}/?token=not-the-token-at-all`);
    expect(wrong?.status()).toBe(401);
    expect(await page.context().cookies()).toEqual([]);
  });

  it('loads with the token, drops it from the address bar and keeps the session in an HttpOnly cookie', async () => {
    const res = await page.goto(`${base}/?token=${TOKEN}`);
    expect(res?.status()).toBe(200);
    expect(page.url()).toBe(`${base}/`);
    await expect.poll(() => page.locator('h1').innerText()).toBe('Overview');
    expect(await page.locator('#task-counts .card[data-state="pending"] b').innerText()).toBe('1');
    const [cookie] = await page.context().cookies();
    expect(cookie).toMatchObject({ name: 'outlive_dashboard', httpOnly: true, sameSite: 'Strict', path: '/dashboard' });
    expect(cookie!.value).not.toContain(TOKEN);
    expect(await page.content()).not.toContain(TOKEN);
    // A page refreshes by itself.
    expect(await page.locator('meta[http-equiv="refresh"]').getAttribute('content')).toBe('5');
  });

  it("draws a run's graph with each task's state, and what waits on what", async () => {
    const failed = await startRun(db.pool, 'nightly import', {
      fetch: step(greet, { name: 'fetch' }),
      parse: step(explode, { why: 'bad row 17' }, { after: ['fetch'] }),
      store: step(greet, { name: 'store' }, { after: ['parse'] }),
      report: step(greet, { name: 'report' }, { after: ['store', 'fetch'] }),
    });
    await tick(db.pool, { tasks });
    const fan = Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`page:${i}`, step(greet, { name: `p${i}` })]));
    const waiting = await startRun(db.pool, 'site import <b>demo</b>', {
      crawl: step(greet, { name: 'crawl' }),
      ...fan,
      finish: step(greet, { name: 'finish' }, { after: Object.keys(fan) }),
    });

    await page.goto(`${base}/runs/${failed.id}`);
    const stateOf = (s: string) => page.locator(`svg.graph g.node[data-step="${s}"]`).getAttribute('data-state');
    expect(await stateOf('fetch')).toBe('succeeded');
    expect(await stateOf('parse')).toBe('failed');
    expect(await stateOf('store')).toBe('skipped');
    expect(await stateOf('report')).toBe('skipped');
    expect(await page.locator('svg.graph path.edge').count()).toBe(4);
    expect(await page.locator('#run-tasks tr[data-state="failed"] td').last().innerText()).toMatch(/failed after 1 attempt: .*bad row 17/);
    expect(await page.locator('h1').innerText()).toMatch(/Run #\d+: nightly import\s+failed/);
    await page.screenshot({ path: path.join(shots, 'run-failed.png'), fullPage: true });

    await page.goto(`${base}/runs/${waiting.id}?refresh=0`);
    // Escaped, not markup.
    expect(await page.locator('h1').innerText()).toContain('site import <b>demo</b>');
    expect(await page.locator('h1 b').count()).toBe(0);
    expect(await stateOf('finish')).toBe('pending');
    expect(await page.locator('#run-tasks tr', { hasText: 'finish' }).innerText()).toMatch(/waiting for "page:0", "page:1", .* and 25 more to succeed/);
    // 31 ready tasks in the first column: 7 drawn, the rest folded into one box.
    expect(await page.locator('svg.graph g.node[data-state="pending"][data-task]').count()).toBe(8);
    expect(await page.locator('svg.graph g.node[data-step="+24 more pending"]').count()).toBe(1);
    expect(await page.locator('#runs').count()).toBe(0);
    await page.screenshot({ path: path.join(shots, 'run-waiting.png'), fullPage: true });
  });

  it('lists a failed task, and its retry button makes it run', async () => {
    const t = await enqueue(db.pool, explode, { why: 'the mail server said no' });
    await tick(db.pool, { tasks });
    await page.goto(`${base}/?refresh=0`);
    const row = page.locator(`#failures tr[data-task="${t.id}"]`);
    expect(await row.locator('td.err').innerText()).toContain('the mail server said no');
    await page.screenshot({ path: path.join(shots, 'overview.png'), fullPage: true });

    await page.goto(`${base}/tasks/${t.id}?refresh=0`);
    expect(await page.locator('#errors td.err').innerText()).toMatch(/NonRetriableError: boom: the mail server said no/);
    await page.screenshot({ path: path.join(shots, 'task-failed.png'), fullPage: true });

    // A POST that did not come from a page (no CSRF value) is refused, even with the cookie.
    const forged = await page.request.post(`${base}/tasks/${t.id}/retry`, { form: { action: 'retry' }, maxRedirects: 0 });
    expect(forged.status()).toBe(403);
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [t.id])).toEqual([{ state: 'failed' }]);

    await page.goto(`${base}/?refresh=0`);
    await Promise.all([page.waitForURL(`${base}/tasks/${t.id}?flash=task-retried`), row.locator('button[data-action="retry"]').click()]);
    expect(await page.locator('.flash').innerText()).toMatch(/^Retried/);
    expect(await page.locator('h1 .badge').innerText()).toBe('pending');
    expect(await db.rows(`SELECT state::text, attempts FROM outlive.tasks WHERE id = $1`, [t.id])).toEqual([{ state: 'pending', attempts: 0 }]);

    fixExplode();
    await tick(db.pool, { tasks });
    await page.goto(`${base}/tasks/${t.id}?refresh=0`);
    expect(await page.locator('h1 .badge').innerText()).toBe('succeeded');
    expect(await page.locator('#output').innerText()).toContain('"fixed": "the mail server said no"');
    // The failed attempt stays in the history.
    expect(await page.locator('#errors tbody tr').count()).toBe(1);
  });

  it('pauses and resumes a key and a queue from the limits page', async () => {
    await setLimit(db.pool, 'openai', { concurrency: 2 });
    await page.goto(`${base}/limits?refresh=0`);
    expect(await page.locator('h1').innerText()).toBe('Limits');
    const row = page.locator('#limits tr[data-key="openai"]');
    expect(await row.locator('td.running').innerText()).toBe('0 of 2 (set)');
    await row.locator('select[name="for"]').selectOption('900000');
    await row.locator('input[name="reason"]').fill('provider <incident>');
    await Promise.all([page.waitForURL(`${base}/limits?flash=key-paused`), row.locator('button[data-action="pause-key"]').click()]);
    expect(await page.locator('.flash').innerText()).toMatch(/^Paused/);
    expect(await row.getAttribute('data-paused')).toBe('yes');
    expect(await row.locator('td.paused').innerText()).toMatch(/^paused by hand until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in 1[45]m\): provider <incident>$/);
    expect(await row.locator('td.paused time').getAttribute('datetime')).toMatch(/Z$/);
    const [paused] = await db.rows<{ paused_until: Date; paused_reason: string }>(`SELECT paused_until, paused_reason FROM outlive.limits WHERE key = 'openai'`);
    expect(paused!.paused_reason).toBe('provider <incident>');
    expect(paused!.paused_until.getTime() - Date.now()).toBeGreaterThan(890_000);

    await page.locator('form.pause-queue input[name="queue"]').fill('imports');
    await page.locator('form.pause-queue input[name="reason"]').fill('deploying');
    await Promise.all([page.waitForURL(`${base}/limits?flash=queue-paused`), page.locator('button[data-action="pause-queue"]').click()]);
    expect(await page.locator('#paused-queues tr[data-queue="imports"]').innerText()).toContain('deploying');
    await page.screenshot({ path: path.join(shots, 'limits.png'), fullPage: true });

    await Promise.all([page.waitForURL(`${base}/limits?flash=key-resumed`), row.locator('button[data-action="resume-key"]').click()]);
    expect(await row.getAttribute('data-paused')).toBe('no');
    await Promise.all([page.waitForURL(`${base}/limits?flash=queue-resumed`), page.locator('#paused-queues button[data-action="resume-queue"]').click()]);
    expect(await page.locator('#paused-queues').count()).toBe(0);
    expect(await db.rows(`SELECT paused_until FROM outlive.limits WHERE key = 'openai'`)).toEqual([{ paused_until: null }]);
    expect(await db.rows(`SELECT queue FROM outlive.queue_pauses`)).toEqual([]);
  });

  it('shows a run of 10,000 steps grouped, with its timeline, and finds a step by name', async () => {
    const id = await insertRun(db.pool, 10_000, 'fan-in');
    await page.goto(`${base}/runs/${id}?refresh=0`);
    const group = page.locator('#step-groups tr[data-prefix="page:*"]');
    expect(await group.locator('td.total').innerText()).toBe('9,999');
    expect(await group.locator('td.states').innerText()).toMatch(/9,989\s+succeeded\s+10\s+failed/);
    expect(await group.locator('td.err').innerText()).toBe('page:1: Error: page 1 answered 500');
    expect(await page.locator('svg#timeline g.bucket').count()).toBe(60);
    expect(await page.locator('svg.graph').count()).toBe(0);
    expect(await page.locator('#run-tasks tbody tr').count()).toBe(100);
    await page.screenshot({ path: path.join(shots, 'run-large.png'), fullPage: true });

    await page.locator('form.step-search input[name="step"]').fill('page:9010');
    await Promise.all([page.waitForURL(/step=page%3A9010/), page.locator('form.step-search button').click()]);
    expect(await page.locator('#run-tasks tbody tr').count()).toBe(1);
    expect(await page.locator('#run-tasks tr[data-state="failed"]').innerText()).toContain('page 9010 answered 500');

    // A small run draws one bar per step that started.
    const small = await startRun(db.pool, 'two steps', { a: step(greet, { name: 'a' }), b: step(greet, { name: 'b' }, { after: ['a'] }) });
    await tick(db.pool, { tasks });
    await tick(db.pool, { tasks });
    await page.goto(`${base}/runs/${small.id}?refresh=0`);
    expect(await page.locator('svg#timeline g.span').count()).toBe(2);
    expect(await page.locator('svg#timeline g.span[data-step="b"]').getAttribute('data-state')).toBe('succeeded');
  });

  it('revalidates on auto-refresh: an unchanged page comes back as 304, with no body', async () => {
    const statuses: number[] = [];
    const quick = await serveHandler(async (request) => {
      const res = await handleDashboard(request, db.pool, { token: TOKEN, basePath: '/dashboard', refreshSeconds: 1 });
      if (new URL(request.url).pathname === '/dashboard/queues') statuses.push(res.status);
      return res;
    });
    try {
      // The session cookie is the host's, whatever the port (and this Chromium runs in one process: a second context would end it).
      await page.goto(`${quick.url}/dashboard/queues`);
      await expect.poll(() => statuses.length, { timeout: 10_000 }).toBeGreaterThanOrEqual(3);
      expect(statuses[0]).toBe(200);
      expect(statuses.slice(1)).toContain(304);
      expect(await page.locator('h1').innerText()).toBe('Queues');
      await page.goto(`${base}/?refresh=0`);
    } finally {
      await quick.close();
    }
  });

  it('retries failed tasks by filter, after a page that shows how many', async () => {
    const failed = [await enqueue(db.pool, greet, { name: 'bulk a' }), await enqueue(db.pool, greet, { name: 'bulk b' })];
    // Failed as a pass would leave them (explode was fixed by an earlier test).
    await db.rows(
      `UPDATE outlive.tasks SET state = 'failed', attempts = 1, finished_at = now(), last_error = 'boom: bulk ' || id WHERE id = ANY ($1::bigint[])`,
      [failed.map((t) => t.id)],
    );
    await page.goto(`${base}/tasks?refresh=0`);
    await page.locator('#task-filters select[name="state"]').selectOption('failed');
    await page.locator('#task-filters input[name="q"]').fill('BOOM: BULK');
    await Promise.all([page.waitForURL(/\/tasks\?state=failed/), page.locator('#task-filters button').click()]);
    expect(await page.locator('#tasks tbody tr').count()).toBe(2);

    await Promise.all([page.waitForURL(/\/bulk\?/), page.locator('a[data-bulk="retry"]').click()]);
    expect(await page.locator('#bulk-count').getAttribute('data-count')).toBe('2');
    expect(await page.locator('#bulk-filter').innerText()).toBe('state = failed, q = BOOM: BULK');
    // Nothing changed yet.
    expect(await db.rows(`SELECT DISTINCT state::text FROM outlive.tasks WHERE id = ANY ($1::bigint[])`, [failed.map((t) => t.id)])).toEqual([{ state: 'failed' }]);
    await page.screenshot({ path: path.join(shots, 'bulk-confirm.png'), fullPage: true });

    await Promise.all([page.waitForURL(/flash=bulk-retry/), page.locator('button[data-action="bulk-retry"]').click()]);
    expect(await page.locator('.flash').innerText()).toBe('Retried 2 tasks.');
    expect(await db.rows(`SELECT DISTINCT state::text FROM outlive.tasks WHERE id = ANY ($1::bigint[])`, [failed.map((t) => t.id)])).toEqual([{ state: 'pending' }]);
  });

  it('takes a bearer token from scripts, without a CSRF value', async () => {
    const res = await fetch(`${base}/`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(res.status).toBe(200);
    const wrong = await fetch(`${base}/`, { headers: { authorization: 'Bearer wrong-token-wrong-token' } });
    expect(wrong.status).toBe(401);
    expect(await wrong.text()).not.toContain('Overview');
  });
});
