/**
 * The dashboard at scale, over a real database with rows written by SQL
 * (scripts/local/rows-at-scale.ts): a run page costs about the same server
 * CPU at 100,000 steps as at 10,000 (checked as a ratio, not a time), shows
 * the steps grouped, paged and searchable, and answers 304 when nothing
 * changed; lists page by keyset and filter; counts stop at their cap; a bulk
 * action counts first, then changes by guarded statements.
 */
import { describe, expect, it } from 'vitest';
import { enqueue, retryRun, tick } from '../src/index.js';
import { handleDashboard, pacedRefresh } from '../src/http/dashboard/index.js';
import { browseTasks } from '../src/admin/browse.js';
import { countBulk, runBulk } from '../src/admin/bulk.js';
import { cancelTasks } from '../src/admin/cancel.js';
import { listRuns, status } from '../src/admin/queries.js';
import { explainSteps } from '../src/admin/explain.js';
import { runGroups, runTimeline } from '../src/admin/run-view.js';
import { insertRun, insertTasks } from '../scripts/local/rows-at-scale.js';
import { freshDb } from './support/db.js';
import { explode, greet, tasks } from './fixtures/cli-tasks.js';

const db = await freshDb();
const TOKEN = 'scale-test-token-0123456789';

async function get(path: string, headers: Record<string, string> = {}, on = db): Promise<{ res: Response; body: string; cpuMs: number }> {
  const start = process.cpuUsage();
  const res = await handleDashboard(new Request(`http://dash.test/dashboard${path}`, { headers: { authorization: `Bearer ${TOKEN}`, ...headers } }), on.pool, { token: TOKEN });
  const body = await res.text();
  const used = process.cpuUsage(start);
  return { res, body, cpuMs: (used.user + used.system) / 1000 };
}

/** The median server CPU of a page over a few renders, after one to warm up. */
async function cpuOf(path: string): Promise<number> {
  await get(path);
  const times: number[] = [];
  for (let i = 0; i < 5; i++) times.push((await get(path)).cpuMs);
  return times.sort((a, b) => a - b)[2]!;
}

describe('a run page at scale', () => {
  it('costs about as much server CPU for 100,000 steps as for 10,000 (ratio at most 10)', async () => {
    const small = await insertRun(db.pool, 10_000, 'fan-in');
    const large = await insertRun(db.pool, 100_000, 'fan-in');
    const chain = await insertRun(db.pool, 100_000, 'chain');
    const [s, l, c] = [await cpuOf(`/runs/${small}`), await cpuOf(`/runs/${large}`), await cpuOf(`/runs/${chain}`)];
    expect(l / s, `fan-in: ${s.toFixed(1)} ms at 10,000 steps, ${l.toFixed(1)} ms at 100,000`).toBeLessThanOrEqual(10);
    expect(c / s, `chain of 100,000: ${c.toFixed(1)} ms`).toBeLessThanOrEqual(10);

    const page = await get(`/runs/${large}`);
    expect(page.res.status).toBe(200);
    // The page does not grow with the run: one page of steps, groups, buckets.
    expect(page.body.length).toBeLessThan(200_000);
    expect(page.body).toContain('The graph is drawn for runs of at most 200 tasks; this one has 100,000.');
  }, 120_000);

  it('groups steps by name with counts and the first error, pages them and searches them by name', async () => {
    const id = await insertRun(db.pool, 10_000, 'fan-in');
    const run = (await runGroups(db.pool, id))!;
    expect(run.total).toBe(10_000);
    const pages = run.groups.find((g) => g.prefix === 'page:*')!;
    expect(pages).toMatchObject({ total: 9_999, search: 'page:' });
    expect(pages.counts.failed).toBe(10);
    expect(pages.counts.succeeded).toBe(9_989);
    expect(pages.firstError).toMatchObject({ step: 'page:1', error: 'Error: page 1 answered 500' });
    expect(run.groups.find((g) => g.prefix === 'finish')).toMatchObject({ total: 1, counts: expect.objectContaining({ skipped: 1 }) });
    // Without a ':', the trailing number is what varies.
    const chain = (await runGroups(db.pool, await insertRun(db.pool, 50, 'chain')))!;
    expect(chain.groups).toEqual([expect.objectContaining({ prefix: 'step-*', search: 'step-', total: 50, firstError: null })]);

    // Pages follow each other by step name, without repeats.
    const first = await explainSteps(db.pool, id, { limit: 100 });
    const second = await explainSteps(db.pool, id, { after: first.next, limit: 100 });
    expect(first.steps).toHaveLength(100);
    expect(second.steps[0]!.step! > first.steps.at(-1)!.step!).toBe(true);
    const found = await explainSteps(db.pool, id, { prefix: 'page:901', limit: 100 });
    expect(found.steps.map((s) => s.step).sort()).toEqual(['page:901', ...Array.from({ length: 10 }, (_, i) => `page:901${i}`)]);
    expect(found.next).toBeNull();
    expect(found.steps.find((s) => s.step === 'page:9010')!.why).toMatch(/failed after 1 attempt: Error: page 9010 answered 500/);

    const timeline = await runTimeline(db.pool, id);
    expect(timeline.kind).toBe('buckets');
    if (timeline.kind === 'buckets') expect(timeline.buckets.reduce((n, b) => n + b.started, 0)).toBe(9_999);

    const { body } = await get(`/runs/${id}?step=page%3A901`);
    expect(body).toMatch(/<tr data-prefix="page:\*">.*?9,999/s);
    expect(body).toContain('<td>page:9010</td>');
    expect(body).not.toContain('<td>page:1</td>');
  });

  it('answers 304 to a browser that holds the page, and 200 once it changed', async () => {
    const run = await insertRun(db.pool, 1_000, 'chain');
    const first = await get(`/runs/${run}`);
    const etag = first.res.headers.get('etag')!;
    expect(etag).toMatch(/^W\/"[0-9a-f]+"$/);
    expect(first.res.headers.get('cache-control')).toBe('private, no-cache');
    const again = await get(`/runs/${run}`, { 'if-none-match': etag });
    expect(again.res.status).toBe(304);
    expect(again.body).toBe('');
    await db.rows(`UPDATE outlive.tasks SET state = 'succeeded', finished_at = now() WHERE run_id = $1 AND state = 'running'`, [run]);
    const changed = await get(`/runs/${run}`, { 'if-none-match': etag });
    expect(changed.res.status).toBe(200);
    expect(changed.res.headers.get('etag')).not.toBe(etag);

    // A finished run is known by its row: a retry reopens it, and the page changes.
    const done = await insertRun(db.pool, 100, 'fan-in');
    const before = (await get(`/runs/${done}`)).res.headers.get('etag')!;
    expect((await get(`/runs/${done}`, { 'if-none-match': before })).res.status).toBe(304);
    expect((await retryRun(db.pool, done)).retried).toBe(true);
    const reopened = await get(`/runs/${done}`, { 'if-none-match': before });
    expect(reopened.res.status).toBe(200);
    expect(reopened.body).toMatch(/Run #\d+: fan-in of 100 <span class="badge state-running"/);
  });
});

describe('the pages\' pace', () => {
  it('refreshes a page less often the longer its reads take: an open page keeps the database busy at most 5 % of the time', async () => {
    expect([10, 250, 251, 600, 1_000, 1_001].map((ms) => pacedRefresh(5, ms))).toEqual([5, 5, 10, 20, 20, 40]);
    expect(pacedRefresh(0, 5_000)).toBe(0);
    expect(pacedRefresh(5, 1e9)).toBe(3_600);

    // The overview's reads held up 600 ms by a lock on a table it reads, on a database of its own.
    const quiet = await freshDb();
    const holder = await quiet.pool.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('LOCK TABLE outlive.schedules IN ACCESS EXCLUSIVE MODE');
      const slow = get('/', {}, quiet);
      await new Promise((r) => setTimeout(r, 600));
      await holder.query('COMMIT');
      const { body, res } = await slow;
      const seconds = Number(/<meta http-equiv="refresh" content="(\d+)">/.exec(body)?.[1]);
      expect(seconds).toBeGreaterThanOrEqual(20);
      expect(body).toContain(`refreshes every ${seconds}s`);
      // The pace is not part of what the page shows: the same rows read faster are the same page,
      // and the browser keeps the one it holds (refreshing at its interval).
      const again = await get('/', { 'if-none-match': res.headers.get('etag')! }, quiet);
      expect(again.res.status).toBe(304);
    } finally {
      holder.release();
    }
    expect((await get('/', {}, quiet)).body).toContain('<meta http-equiv="refresh" content="5">');
  });
});

describe('lists, counts and bulk actions at scale', () => {
  it('counts from indexes, stopping at the cap', async () => {
    await insertTasks(db.pool, 100_000);
    const s = await status(db.pool, { cap: 1_000 });
    expect(s.tasks.succeeded).toBe(1_000);
    expect(s.more!.tasks).toContain('succeeded');
    expect(s.queues.map((q) => q.queue)).toEqual(expect.arrayContaining(['default', 'imports', 'mail']));
    // Under a cap no count reaches, the counts from indexes are the exact
    // ones, but for the steps of runs still waiting on others: no index of
    // live rows holds them (one would cost every task an entry; they show on
    // their run's page).
    const [wide, exact, [blocked]] = await Promise.all([
      status(db.pool, { cap: 10_000_000 }),
      status(db.pool),
      db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'pending' AND waiting_on > 0`),
    ]);
    expect(wide.more).toEqual({ tasks: [], runs: [] });
    expect(wide.tasks).toEqual({ ...exact.tasks, pending: exact.tasks.pending - blocked!.n });
    expect(wide.runs).toEqual(exact.runs);
    expect(wide.failedLastHour).toBe(exact.failedLastHour);
    const { body } = await get('/?refresh=0');
    expect(body).toMatch(/data-state="succeeded">.*?<b>\d+\+<\/b>/s);
  });

  it('counts each listed run\'s tasks up to the cap; what is left comes exact from the run\'s row', async () => {
    const runs = await listRuns(db.pool, { limit: 20, cap: 10_000 });
    const rows = await db.rows<{ id: string; unfinished: number; total: number }>(
      `SELECT r.id::text, r.unfinished, (SELECT count(*)::int FROM outlive.tasks t WHERE t.run_id = r.id) AS total FROM outlive.runs r`,
    );
    const big = rows.filter((r) => r.total > 10_000);
    expect(big.length).toBeGreaterThan(0);
    for (const row of rows) {
      const listed = runs.find((r) => r.id === row.id)!;
      expect(listed).toMatchObject({ unfinished: row.unfinished, capped: row.total > 10_000, total: Math.min(row.total, 10_000) });
    }
    // Without a cap (the CLI's list), the counts are exact.
    const exact = await listRuns(db.pool, { limit: 20 });
    expect(exact.find((r) => r.id === big[0]!.id)).toMatchObject({ total: big[0]!.total, capped: false });
    const { body } = await get('/?refresh=0');
    expect(body).toMatch(new RegExp(`data-run="${big[0]!.id}">.*?${big[0]!.unfinished.toLocaleString('en-US')} left of over 10,000`, 's'));
  });

  it('pages tasks by keyset, filtered and searched, and says when a page stopped at its window', async () => {
    const first = await browseTasks(db.pool, { name: 'task-3', queue: 'mail' }, { limit: 20 });
    expect(first.tasks).toHaveLength(20);
    expect(first.tasks.every((t) => t.name === 'task-3' && t.queue === 'mail')).toBe(true);
    const second = await browseTasks(db.pool, { name: 'task-3', queue: 'mail' }, { before: first.next, limit: 20 });
    expect(BigInt(second.tasks[0]!.id)).toBeLessThan(BigInt(first.tasks.at(-1)!.id));

    const rare = await browseTasks(db.pool, { error: '503 FOR ROW 99' }, { limit: 20, window: 10_000 });
    expect(rare.windowEnded).toBe(true);
    expect(rare.next).not.toBeNull();
    expect(rare.tasks.every((t) => /503 for row 99/.test(t.lastError!))).toBe(true);

    const { res, body } = await get('/tasks?state=failed&queue=imports&refresh=0');
    expect(res.status).toBe(200);
    expect(body).toContain('data-state="failed"');
    expect(body).not.toContain('data-state="succeeded"');
    expect((await get('/tasks?state=nonsense')).res.status).toBe(400);
    expect((await get('/tasks?from=yesterday')).res.status).toBe(400);
  });

  it('shows the queues with depth and lag', async () => {
    const { body } = await get('/queues?refresh=0');
    expect(body).toMatch(/<tr data-queue="imports">/);
    expect(body).toMatch(/class="lag">\d+s</);
  });

  it('counts a bulk retry first, then retries by guarded statements; a bulk cancel leaves finished tasks alone', async () => {
    const failed = [];
    for (let i = 0; i < 3; i++) failed.push(await enqueue(db.pool, explode, { why: `bulk ${i}` }));
    await tick(db.pool, { tasks });
    expect(await countBulk(db.pool, 'retry', { name: 'explode' })).toEqual({ n: 3, more: false });
    const { body } = await get('/bulk?action=retry&name=explode&refresh=0');
    expect(body).toContain('data-count="3"');
    const report = await runBulk(db.pool, 'retry', { name: 'explode' });
    expect(report).toEqual({ changed: 3, runs: 0, skipped: 0 });
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE name = 'explode'`)).toEqual([{ state: 'pending' }, { state: 'pending' }, { state: 'pending' }]);

    const waiting = await enqueue(db.pool, greet, { name: 'cancel me' });
    expect(await countBulk(db.pool, 'cancel', { name: 'greet' })).toEqual({ n: 1, more: false });
    // Finished between the count and the statement: the guard leaves it.
    await db.rows(`UPDATE outlive.tasks SET state = 'succeeded', finished_at = now() WHERE id = $1`, [waiting.id]);
    expect(await cancelTasks(db.pool, [waiting.id])).toEqual({ pending: 0, running: 0 });
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [waiting.id])).toEqual([{ state: 'succeeded' }]);
  });

  it('cancels by filter through the POST a confirmation page sends, pending and running tasks outside runs only', async () => {
    const plain = [await enqueue(db.pool, greet, { name: 'c1' }, { queue: 'to-cancel' }), await enqueue(db.pool, greet, { name: 'c2' }, { queue: 'to-cancel' })];
    await db.rows(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'gone', lease_expires_at = now() + interval '1 min' WHERE id = $1`, [plain[1]!.id]);
    const run = await insertRun(db.pool, 10, 'chain');
    await db.rows(`UPDATE outlive.tasks SET queue = 'to-cancel' WHERE run_id = $1`, [run]);
    expect((await get('/bulk?action=cancel&queue=to-cancel')).body).toContain('data-count="2"');
    const res = await handleDashboard(
      new Request('http://dash.test/dashboard/bulk', { method: 'POST', headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/x-www-form-urlencoded' }, body: 'action=cancel&queue=to-cancel' }),
      db.pool,
      { token: TOKEN },
    );
    expect(res.status).toBe(303);
    expect(res.headers.get('location')).toMatch(/\/dashboard\/tasks\?queue=to-cancel&flash=bulk-cancel&changed=2&/);
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = ANY ($1::bigint[]) ORDER BY id`, [plain.map((t) => t.id)])).toEqual([{ state: 'cancelled' }, { state: 'cancelled' }]);
    // The run's steps are left to the run's own cancel.
    expect(await db.rows(`SELECT pg_catalog.count(*)::int AS n FROM outlive.tasks WHERE run_id = $1 AND state = 'cancelled'`, [run])).toEqual([{ n: 0 }]);
    const flash = await get(`/tasks?queue=to-cancel&flash=bulk-cancel&changed=2&runs=0&skipped=0&refresh=0`);
    expect(flash.body).toContain('Cancelled 2 tasks.');
  });
});
