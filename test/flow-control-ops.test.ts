/**
 * Flow control as an operator meets it (issue 26): `outlive status` and
 * `outlive limits` say why tasks wait (a full key, a rate's window, a 429's
 * pause, a paused queue); `outlive limit|queue|weight` change it at run
 * time; `explainRun` tells a run's waiting task why; the dashboard's limits
 * page shows keys and paused queues, with pause and resume buttons behind
 * the same CSRF check as retry and cancel. Against a real database; the CLI
 * runs in this process (`main`), with its output and exit codes.
 */
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, enqueueMany, explainRun, pauseQueue, RateLimitedError, setLimit, startRun, step, tick } from '../src/index.js';
import { claim } from '../src/pass/claim.js';
import { keyStates, readKeyStates, status } from '../src/admin/queries.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { csrfValue } from '../src/http/dashboard/auth.js';
import { main } from '../src/node/cli.js';
import { freshDb, passExecutor, type TestDb } from './support/db.js';

const db = await freshDb();

/** Runs the CLI in this process; resolves with its exit code and output. */
async function cli(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main([...args, '--database-url', db.url], { out: (l) => void out.push(l), err: (l) => void err.push(l) });
  return { code, out: out.join('\n'), err: err.join('\n') };
}

/** A failure: one line on stderr, the exit code given. */
async function refused(code: number, ...args: string[]): Promise<string> {
  const r = await cli(...args);
  expect(r.code, `${args.join(' ')}: ${r.out}`).toBe(code);
  expect(r.err.split('\n'), args.join(' ')).toHaveLength(1);
  return r.err;
}

const TOKEN = 'flow-control-ops-dashboard-token';
const dashboard = (path: string, init: RequestInit = {}) =>
  handleDashboard(new Request(`http://app.test/dashboard${path}`, init), db.pool, { token: TOKEN, log: () => undefined });

/** A dashboard page, as a script reads it (bearer token). */
async function page(path: string): Promise<string> {
  const res = await dashboard(path, { headers: { authorization: `Bearer ${TOKEN}` } });
  expect(res.status, path).toBe(200);
  return res.text();
}

async function keyRow(d: TestDb, key: string) {
  const [row] = await d.rows<{
    concurrency: number | null; rate_limit: number | null; rate_period_ms: number | null; running: number;
    starts: [number, number, string, number][]; paused_until: Date | number | null; paused_reason: string | null;
  }>(`SELECT concurrency, rate_limit, rate_period_ms, running, starts, paused_until, paused_reason FROM outlive.limits WHERE key = $1`, [key]);
  return row;
}

/** Holds up to `limit` tasks of these names as running (claimed, never settled): their slots stay taken. */
const hold = (d: TestDb, names: string[], limit = 10) =>
  claim(passExecutor(d.pool), { owner: 'test-holder', limit, maxTimeoutMs: 600_000, queues: null, names, leaseGraceMs: 1_000, leaseMs: 600_000, now: null });

const call = defineTask({ name: 'ops.call', input: z.object({ n: z.number() }), limits: [{ key: 'openai', concurrency: 2 }], run: () => undefined });
const tokens = defineTask({
  name: 'ops.tokens',
  input: z.object({ est: z.number() }),
  limits: [{ key: 'openai-tokens', rate: { limit: 100, periodMs: 3_600_000 }, cost: (i) => i.est }],
  run: () => undefined,
});
const provider = defineTask({
  name: 'ops.provider',
  input: z.object({ n: z.number() }),
  limits: [{ key: 'prov', concurrency: 5 }],
  run() {
    throw new RateLimitedError({ key: 'prov', retryAfterMs: 600_000 });
  },
});
const importer = defineTask({ name: 'ops.import', input: z.object({}), queue: 'imports', run: () => undefined });
const plain = defineTask({ name: 'ops.plain', input: z.object({}), run: () => undefined });

/**
 * The scene every test reads: key openai full (2 of 2 running, 3 waiting),
 * openai-tokens' window full (90 of 100, a start of 50 waiting), prov paused
 * by a 429 (2 waiting), queue imports paused (1 pending).
 */
async function scene() {
  await enqueueMany(db.pool, call, Array.from({ length: 5 }, (_, n) => ({ n })));
  expect(await hold(db, ['ops.call'])).toHaveLength(2);
  // The claim that finds the key full sets the others aside, waiting for it.
  expect(await hold(db, ['ops.call'])).toHaveLength(0);
  await enqueueMany(db.pool, tokens, [{ est: 60 }, { est: 30 }, { est: 50 }]);
  expect((await tick(db.pool, { tasks: [tokens] })).claimed).toBe(2);
  expect((await tick(db.pool, { tasks: [tokens] })).claimed).toBe(0);
  await enqueue(db.pool, provider, { n: 1 });
  expect((await tick(db.pool, { tasks: [provider] })).claimed).toBe(1);
  await enqueue(db.pool, provider, { n: 2 });
  expect((await tick(db.pool, { tasks: [provider] })).claimed).toBe(0);
  await pauseQueue(db.pool, 'imports', { reason: 'deploying' });
  await enqueue(db.pool, importer, {});
  const tok = (await keyRow(db, 'openai-tokens'))!;
  const prov = (await keyRow(db, 'prov'))!;
  return {
    // The 50 fits once the start of 60 leaves the window: at its start + 1 h.
    nextTokenStart: new Date(Math.ceil(tok.starts[0]![0] + 3_600_000)),
    provUntil: prov.paused_until as Date,
  };
}

const { nextTokenStart, provUntil } = await scene();

describe('outlive status', () => {
  it('names why tasks wait: a full key, a full window, a 429, a paused queue', async () => {
    const r = await cli('status');
    expect(r.code, r.err).toBe(0);
    const lines = r.out.split('\n');
    expect(lines).toContain('3 tasks wait for key openai: 2 of 2 running');
    expect(lines).toContain(`1 task waits for rate limit openai-tokens: next start at ${nextTokenStart.toISOString()} (90 of 100 per 1h used)`);
    expect(lines).toContain(
      `2 tasks wait: key prov paused until ${provUntil.toISOString()} after a 429: rate limited on key "prov": retry after 600000 ms`,
    );
    expect(lines.find((l) => l.startsWith('queue imports is paused'))).toMatch(/^queue imports is paused: deploying \(since \S+Z; 1 pending\)$/);
    const j = JSON.parse((await cli('status', '--json')).out) as { waits: { key: string; waiting: number; wait: { kind: string } | null }[] };
    expect(j.waits.map((w) => [w.key, w.waiting, w.wait?.kind])).toEqual([
      ['openai', 3, 'concurrency'],
      ['openai-tokens', 1, 'rate'],
      ['prov', 2, 'paused'],
    ]);
  });

  it('counts waiting tasks up to a cap, and says when there are more', async () => {
    const [capped] = await readKeyStates(passExecutor(db.pool), [{ key: 'openai' }], { waitingCap: 2 });
    expect(capped).toMatchObject({ key: 'openai', waiting: 2, waitingMore: true });
    const [exact] = await readKeyStates(passExecutor(db.pool), [{ key: 'openai' }], { waitingCap: 3 });
    expect(exact).toMatchObject({ waiting: 3, waitingMore: false });
  });
});

describe('outlive limits', () => {
  it('tables each key: running of its concurrency, its rate and window, its pause, the tasks waiting; and the paused queues', async () => {
    const r = await cli('limits');
    expect(r.code, r.err).toBe(0);
    const lines = r.out.split('\n');
    expect(lines[0]).toMatch(/^key\s+running\s+concurrency\s+rate\s+window\s+paused\s+waiting$/);
    expect(lines.find((l) => l.startsWith('openai '))).toMatch(/^openai\s+2\s+2\s+-\s+-\s+-\s+3$/);
    expect(lines.find((l) => l.startsWith('openai-tokens '))).toMatch(/^openai-tokens\s+0\s+-\s+100 per 1h\s+90 of 100, next start in (59m \d+s|1h 0m)\s+-\s+1$/);
    expect(lines.find((l) => l.startsWith('prov '))).toMatch(/^prov\s+0\s+5\s+-\s+-\s+(9m \d+s|10m 0s) more \(429\): rate limited on key "prov": retry after 600000 ms\s+2$/);
    expect(lines).toContainEqual(expect.stringMatching(/^queue imports is paused: deploying \(since \S+Z\)$/));

    const j = JSON.parse((await cli('limits', 'openai-tokens', 'prov', '--json')).out) as {
      keys: { key: string; windowUsed: number | null; nextStartAt: string | null; pause: { by: string; until: string } | null }[];
      total: number;
      pausedQueues: { queue: string; reason: string }[];
    };
    expect(j.keys.map((k) => k.key)).toEqual(['openai-tokens', 'prov']);
    expect(j.keys[0]).toMatchObject({ windowUsed: 90, nextStartAt: nextTokenStart.toISOString(), pause: null });
    expect(j.keys[1]!.pause).toEqual({ until: provUntil.toISOString(), reason: 'rate limited on key "prov": retry after 600000 ms', by: 'rate-limited' });
    expect(j.pausedQueues).toEqual([expect.objectContaining({ queue: 'imports', reason: 'deploying' })]);

    // Capped: the key that holds tasks back comes first, and the rest is counted.
    const capped = await cli('limits', '--limit', '1');
    expect(capped.out.split('\n').filter((l) => /^(openai|prov)/.test(l)).map((l) => l.split(/\s+/)[0])).toEqual(['prov']);
    expect(capped.out).toContain('1 of 3 keys shown (paused, waiting and running first): name keys, or raise --limit');
  });
});

describe('what rows hold, printed', () => {
  // Keys, reasons and queues another role may write, with a newline (a forged line) and terminal escapes.
  it('escapes keys, reasons and queues: no control character reaches the terminal', async () => {
    const odd = (label: string) => `${label}\u001b[2J\u202e\nFAKE: ok\u0007`;
    await db.pool.query(`INSERT INTO outlive.limits (key, paused_until, paused_reason) VALUES ($1, 'infinity', $2)`, [odd('key'), odd('reason')]);
    await db.pool.query(`INSERT INTO outlive.queue_pauses (queue, reason) VALUES ($1, $2)`, [odd('queue'), odd('why')]);
    try {
      for (const args of [['limits'], ['status'], ['limit', 'pause', odd('key'), '--reason', 'x']]) {
        const r = await cli(...args);
        expect(r.code, r.err).toBe(0);
        expect(r.out, args[0]).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e]/);
        expect(r.out, args[0]).not.toMatch(/^FAKE: ok/m);
      }
      expect((await cli('status')).out).toContain('key key\\u001b[2J\\u202e\\nFAKE: ok\\u0007 paused by hand until resumed: x: no task waits for it yet');
      expect((await cli('limits')).out).toContain('queue queue\\u001b[2J\\u202e\\nFAKE: ok\\u0007 is paused: why\\u001b[2J');
    } finally {
      await db.pool.query(`DELETE FROM outlive.limits WHERE key = $1`, [odd('key')]);
      await db.pool.query(`DELETE FROM outlive.queue_pauses WHERE queue = $1`, [odd('queue')]);
    }
  });
});

describe('outlive limit, queue and weight', () => {
  it('sets and clears a key\'s overrides, and the next claim obeys', async () => {
    const set = await cli('limit', 'set', 'openai', '--concurrency', '3');
    expect(set.code, set.err).toBe(0);
    expect(set.out).toBe('key openai: 2 running; concurrency 3 (set); no rate; not paused; 3 tasks wait');
    expect(await keyRow(db, 'openai')).toMatchObject({ concurrency: 3, rate_limit: null });
    // The key wakes its waiting tasks; the third slot is taken.
    expect(await hold(db, ['ops.call'])).toHaveLength(1);
    expect((await cli('status')).out).toContain('2 tasks wait for key openai: 3 of 3 running');

    const rate = await cli('limit', 'set', 'openai-tokens', '--rate', '200/90s');
    expect(rate.code, rate.err).toBe(0);
    expect(rate.out).toBe('key openai-tokens: 0 running; no concurrency limit; rate 200 per 90s (set), 90 used in the window; not paused; 1 task waits');
    expect(await keyRow(db, 'openai-tokens')).toMatchObject({ rate_limit: 200, rate_period_ms: 90_000 });

    expect((await cli('limit', 'set', 'openai', '--concurrency', 'none')).code).toBe(0);
    expect((await cli('limit', 'set', 'openai-tokens', '--rate', 'none')).code).toBe(0);
    expect(await keyRow(db, 'openai')).toMatchObject({ concurrency: null });
    expect(await keyRow(db, 'openai-tokens')).toMatchObject({ rate_limit: null, rate_period_ms: null });
    // Back to what the tasks declare: 3 running of 2.
    expect((await cli('status')).out).toContain('2 tasks wait for key openai: 3 of 2 running');
  });

  it('pauses a key by hand, for a while or until resumed, and resumes it', async () => {
    const before = Date.now();
    const paused = await cli('limit', 'pause', 'openai-tokens', '--for', '10m', '--reason', 'provider incident');
    expect(paused.code, paused.err).toBe(0);
    const row = (await keyRow(db, 'openai-tokens'))!;
    expect((row.paused_until as Date).getTime()).toBeGreaterThanOrEqual(before + 600_000);
    expect((row.paused_until as Date).getTime()).toBeLessThan(Date.now() + 600_000);
    expect(row.paused_reason).toBe('provider incident');
    expect(paused.out).toBe(`key openai-tokens paused by hand until ${(row.paused_until as Date).toISOString()}: provider incident`);
    const tokenTask = await enqueue(db.pool, tokens, { est: 1 });
    expect((await tick(db.pool, { tasks: [tokens] })).claimed).toBe(0);
    expect(await db.rows(`SELECT blocked_on FROM outlive.tasks WHERE id = $1`, [tokenTask.id])).toEqual([{ blocked_on: 'openai-tokens' }]);

    const resumed = await cli('limit', 'resume', 'openai-tokens');
    expect(resumed.code, resumed.err).toBe(0);
    expect(resumed.out).toBe('key openai-tokens resumed: 2 tasks wait for it, which the next pass may start');
    expect(await keyRow(db, 'openai-tokens')).toMatchObject({ paused_until: null, paused_reason: null });
    expect(await refused(1, 'limit', 'resume', 'openai-tokens')).toBe('outlive: key openai-tokens was not resumed: it is not paused');
    expect(await refused(1, 'limit', 'resume', 'no-such-key')).toBe('outlive: no key no-such-key: no claim has looked at a task of it, and it was never set or paused');

    // Until resumed: the row holds infinity, read as "until resumed".
    const forever = await cli('limit', 'pause', 'manual', '--json');
    expect(forever.code, forever.err).toBe(0);
    expect(JSON.parse(forever.out)).toMatchObject({ key: 'manual', known: true, pause: { until: null, reason: 'paused by hand', by: 'hand' } });
    expect((await cli('limit', 'pause', 'manual2', '--reason', 'maintenance')).out).toBe('key manual2 paused by hand until resumed: maintenance');
  });

  it('pauses and resumes a queue, and sets a fairness weight', async () => {
    const paused = await cli('queue', 'pause', 'mail', '--reason', 'smtp down');
    expect(paused.code, paused.err).toBe(0);
    expect(paused.out).toBe('queue mail paused: no pass claims its tasks until `outlive queue resume mail`');
    expect(await db.rows(`SELECT queue, reason FROM outlive.queue_pauses WHERE queue = 'mail'`)).toEqual([{ queue: 'mail', reason: 'smtp down' }]);
    expect((await cli('queue', 'resume', 'mail')).out).toBe('queue mail resumed: its tasks are claimed again');
    expect(await db.rows(`SELECT queue FROM outlive.queue_pauses WHERE queue = 'mail'`)).toEqual([]);
    expect(await refused(1, 'queue', 'resume', 'mail')).toBe('outlive: queue mail was not resumed: it is not paused');

    const weight = await cli('weight', 'default', 'gold', '2.5');
    expect(weight.code, weight.err).toBe(0);
    expect(weight.out).toBe("key gold weighs 2.5 in queue default: its tasks placed from now on take 2.5 turns to a weight-1 key's 1");
    expect(await db.rows(`SELECT weight FROM outlive.fairness WHERE queue = 'default' AND key = 'gold'`)).toEqual([{ weight: 2.5 }]);
  });

  it('refuses bad input with one line and exit 2, writing nothing', async () => {
    const before = await db.rows(`SELECT key, concurrency, rate_limit, paused_until FROM outlive.limits ORDER BY key`);
    expect(await refused(2, 'limit', 'set', 'openai')).toBe('outlive: say what to set: --concurrency <n|none> and/or --rate <limit>/<period>|none');
    expect(await refused(2, 'limit', 'set', 'openai', '--concurrency', '0')).toMatch(/^outlive: option '--concurrency <n\|none>' argument '0' is invalid\. expected a whole number from 1 to 1000000/);
    expect(await refused(2, 'limit', 'set', 'openai', '--concurrency', '2.5')).toMatch(/argument '2\.5' is invalid/);
    expect(await refused(2, 'limit', 'set', 'openai', '--rate', '60')).toMatch(/argument '60' is invalid\. expected <limit>\/<period>/);
    expect(await refused(2, 'limit', 'set', 'openai', '--rate', '60/2d')).toMatch(/argument '60\/2d' is invalid/);
    expect(await refused(2, 'limit', 'set', 'x'.repeat(501), '--concurrency', '1')).toBe(
      'outlive: a limit key must be a non-empty string of at most 500 characters, without NUL characters',
    );
    expect(await refused(2, 'limit', 'pause', 'openai', '--until', '2020-01-01T00:00:00Z')).toBe('outlive: --until 2020-01-01T00:00:00.000Z is in the past');
    expect(await refused(2, 'limit', 'pause', 'openai', '--until', 'tomorrow')).toMatch(/expected an ISO 8601 time/);
    expect(await refused(2, 'limit', 'pause', 'openai', '--for', '10 minutes')).toMatch(/expected a duration such as 500ms, 90s, 10m/);
    expect(await refused(2, 'limit', 'pause', 'openai', '--until', '2099-01-01T00:00:00Z', '--for', '1m')).toMatch(/cannot be used with option '--for <duration>'/);
    expect(await refused(2, 'limit', 'pause', 'openai', '--reason', 'x'.repeat(501))).toBe('outlive: a reason must be a string of at most 500 characters');
    expect(await refused(2, 'queue', 'pause', 'bad queue')).toMatch(/^outlive: queue name "bad queue" is invalid/);
    expect(await refused(2, 'weight', 'default', 'gold', '0')).toMatch(/expected a number greater than 0 and at most 1000/);
    expect(await refused(2, 'weight', 'default', 'gold', 'heavy')).toMatch(/expected a number greater than 0 and at most 1000/);
    const err: string[] = [];
    expect(await main(['limit'], { out: () => undefined, err: (l) => void err.push(l) })).toBe(2);
    expect(err.join('\n')).toMatch(/Usage: outlive limit .*\n[\s\S]*set \[options\] <key>[\s\S]*pause \[options\] <key>[\s\S]*resume \[options\] <key>/);
    expect(await db.rows(`SELECT key, concurrency, rate_limit, paused_until FROM outlive.limits ORDER BY key`)).toEqual(before);
    expect(await db.rows(`SELECT queue FROM outlive.queue_pauses WHERE queue = 'bad queue'`)).toEqual([]);
  });
});

describe('explainRun', () => {
  it('says which limit or pause holds a run\'s task back, and keeps the other reasons', async () => {
    await pauseQueue(db.pool, 'imports', { reason: 'deploying' });
    const paused = defineTask({ name: 'ops.paused', input: z.object({}), limits: [{ key: 'manual2', concurrency: 1 }], run: () => undefined });
    const run = await startRun(db.pool, 'held back', {
      full: step(call, { n: 10 }),
      rated: step(tokens, { est: 50 }),
      refused: step(provider, { n: 3 }),
      queued: step(importer, {}),
      manual: step(paused, {}),
      plain: step(plain, {}),
      after: step(plain, {}, { after: ['full'] }),
    });
    const why = async () => Object.fromEntries((await explainRun(db.pool, run.id))!.tasks.map((t) => [t.step, t.why]));
    const prov = (await keyRow(db, 'prov'))!;
    const tok = (await keyRow(db, 'openai-tokens'))!;
    const window = tok.starts.filter((s) => s[0] > Date.now() - 3_600_000);
    const reasons = await why();
    expect(reasons).toMatchObject({
      full: 'waiting: 3 of 2 running for key openai',
      refused: `waiting: key prov paused until ${(prov.paused_until as Date).toISOString()} after a 429: rate limited on key "prov": retry after 600000 ms`,
      queued: 'waiting: queue imports is paused: deploying',
      manual: 'waiting: key manual2 paused by hand until resumed: maintenance',
      after: 'waiting for "full" to succeed',
    });
    expect(reasons.plain).toMatch(/^ready: waiting for a pass to claim it$|no pass that ran knows task "ops\.plain"/);
    const used = window.reduce((s, x) => s + x[1], 0);
    // The tasks' rate: the window (90 of 100) holds a start of 50 back.
    expect(used).toBe(90);
    expect(reasons.rated).toMatch(new RegExp(`^waiting: rate limit openai-tokens: next start at \\S+Z \\(${used} of 100 per 1h used\\)$`));

    // A task found waiting for a key that has room now says when it is looked at again.
    await hold(db, ['ops.call']);
    const [full] = await db.rows<{ blocked_on: string | null }>(`SELECT blocked_on FROM outlive.tasks WHERE id = $1`, [run.tasks.full]);
    expect(full!.blocked_on).toBe('openai');
    await setLimit(db.pool, 'openai', { concurrency: 50 });
    expect((await why()).full).toBe('waiting: key openai has room again: the next pass takes its waiting tasks');
    expect((await cli('status')).out).toContain('tasks wait: key openai has room again: the next pass takes its waiting tasks');
    // Woken only when a slot is given back (wake_at infinity), or at a time.
    await db.pool.query(`UPDATE outlive.limits SET wake_at = 'infinity' WHERE key = 'openai'`);
    expect((await why()).full).toBe(
      'waiting: key openai has room (3 running), but its waiting tasks are looked at again only when one of its running tasks gives its slot back',
    );
    await db.pool.query(`UPDATE outlive.limits SET wake_at = '2099-01-01T00:00:00Z' WHERE key = 'openai'`);
    expect((await why()).full).toBe('waiting: key openai has room: its waiting tasks are looked at again at 2099-01-01T00:00:00.000Z');
    await setLimit(db.pool, 'openai', { concurrency: null });
  });
});

describe('the dashboard', () => {
  const token = TOKEN;
  const bearer = { authorization: `Bearer ${token}` };
  const request = dashboard;
  /** A browser's session: the cookie a login with `?token=` sets. */
  const session = async () => (await request(`/?token=${token}`)).headers.get('set-cookie')!.split(';')[0]!;
  /** A browser's POST: the session cookie, the page's origin, and the form (with or without the CSRF value). */
  const browserPost = async (path: string, fields: Record<string, string>, csrf = true) =>
    request(path, {
      method: 'POST',
      headers: { cookie: await session(), origin: 'http://app.test', 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ ...fields, ...(csrf ? { csrf: await csrfValue(token) } : {}) }).toString(),
    });

  it('shows the keys, their windows and pauses, the waiting tasks and the paused queues', async () => {
    const body = await page('/limits');
    const row = (key: string) => new RegExp(`<tr data-key="${key}"[^>]*>([\\s\\S]*?)</tr>`).exec(body)?.[1] ?? '';
    expect(row('openai')).toMatch(/<td class="running">3 of 2<\/td>/);
    expect(row('openai')).toContain('<td class="why">3 of 2 running for key openai</td>');
    expect(row('openai-tokens')).toMatch(/<span class="window">\d+ of 100<\/span>/);
    expect(row('prov')).toContain('after a 429: rate limited on key &quot;prov&quot;: retry after 600000 ms');
    expect(row('prov')).toMatch(/<td class="waiting">2<\/td>/);
    expect(row('prov')).toContain('data-action="resume-key"');
    expect(row('openai')).toContain('data-action="pause-key"');
    expect(body).toMatch(/<tr data-queue="imports"><td>imports<\/td><td>deploying<\/td>/);
    // Every form carries the CSRF value.
    const forms = body.match(/<form [^>]*method="post"[^>]*>/g) ?? [];
    expect(forms.length).toBeGreaterThan(5);
    expect(body.match(/<input type="hidden" name="csrf" value="[0-9a-f]{64}">/g)).toHaveLength(forms.length);

    const overview = await page('/');
    expect(overview).toContain('<h2>Held back by flow control</h2>');
    expect(overview).toMatch(/<tr data-key="prov"><td>key prov<\/td><td>2 tasks<\/td><td>key prov paused until \S+Z after a 429/);
    expect(overview).toMatch(/<tr data-queue="imports"><td>queue imports<\/td><td>\d+ tasks pending<\/td><td>queue imports is paused: deploying/);
  });

  it('pauses and resumes keys and queues from its forms, only with the page\'s CSRF value', async () => {
    const forged = await browserPost('/limits/pause', { key: 'openai', reason: 'forged' }, false);
    expect(forged.status).toBe(403);
    const crossSite = await request('/limits/pause', {
      method: 'POST',
      headers: { cookie: await session(), origin: 'http://evil.test', 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ key: 'openai', csrf: await csrfValue(token) }).toString(),
    });
    expect(crossSite.status).toBe(403);
    expect(await keyRow(db, 'openai')).toMatchObject({ paused_until: null });

    const before = Date.now();
    const paused = await browserPost('/limits/pause', { key: 'openai', for: '900000', reason: 'from the dashboard' });
    expect(paused.status).toBe(303);
    expect(paused.headers.get('location')).toBe('/dashboard/limits?flash=key-paused');
    const row = (await keyRow(db, 'openai'))!;
    expect((row.paused_until as Date).getTime()).toBeGreaterThanOrEqual(before + 900_000);
    expect(row.paused_reason).toBe('from the dashboard');
    expect(await page('/limits?flash=key-paused')).toContain('<div class="flash" role="status">Paused:');

    expect((await browserPost('/limits/resume', { key: 'openai' })).headers.get('location')).toBe('/dashboard/limits?flash=key-resumed');
    expect(await keyRow(db, 'openai')).toMatchObject({ paused_until: null });
    expect((await browserPost('/limits/resume', { key: 'never-seen' })).headers.get('location')).toBe('/dashboard/limits?flash=key-not-resumed');

    // Until resumed, with the default reason; by bearer token, as scripts do.
    const scripted = await request('/limits/pause', { method: 'POST', headers: { ...bearer, 'content-type': 'application/x-www-form-urlencoded' }, body: 'key=scripted&for=' });
    expect(scripted.headers.get('location')).toBe('/dashboard/limits?flash=key-paused');
    expect(await keyStates(db.pool, ['scripted'])).toEqual([expect.objectContaining({ pause: { until: null, reason: 'paused by hand', by: 'hand' } })]);

    expect((await browserPost('/queues/pause', { queue: 'reports', reason: 'quarter end' })).headers.get('location')).toBe('/dashboard/limits?flash=queue-paused');
    expect(await db.rows(`SELECT reason FROM outlive.queue_pauses WHERE queue = 'reports'`)).toEqual([{ reason: 'quarter end' }]);
    expect(await page('/limits')).toMatch(/<tr data-queue="reports"><td>reports<\/td><td>quarter end<\/td>/);
    expect((await browserPost('/queues/resume', { queue: 'reports' })).headers.get('location')).toBe('/dashboard/limits?flash=queue-resumed');
    expect((await browserPost('/queues/resume', { queue: 'reports' })).headers.get('location')).toBe('/dashboard/limits?flash=queue-not-paused');
    expect(await db.rows(`SELECT queue FROM outlive.queue_pauses WHERE queue = 'reports'`)).toEqual([]);
  });

  it('refuses a bad form with 400 and writes nothing', async () => {
    const before = await db.rows(`SELECT key, paused_until FROM outlive.limits ORDER BY key`);
    for (const [path, fields] of [
      ['/limits/pause', { key: '' }],
      ['/limits/pause', { key: 'openai', for: 'soon' }],
      ['/limits/pause', { key: 'openai', for: String(31 * 86_400_000) }],
      ['/limits/pause', { key: 'openai', reason: 'x'.repeat(501) }],
      ['/queues/pause', { queue: 'bad queue' }],
    ] as const) {
      const res = await browserPost(path, fields);
      expect(res.status, JSON.stringify(fields)).toBe(400);
      expect(await res.text()).toContain('<h1>Bad request</h1>');
    }
    expect(await db.rows(`SELECT key, paused_until FROM outlive.limits ORDER BY key`)).toEqual(before);
    expect(await db.rows(`SELECT queue FROM outlive.queue_pauses WHERE queue = 'bad queue'`)).toEqual([]);
  });

  it('escapes keys and reasons', async () => {
    await db.pool.query(`INSERT INTO outlive.limits (key, paused_until, paused_reason) VALUES ('<script>k</script>', 'infinity', '<img src=x onerror=alert(1)>')`);
    const body = await page('/limits');
    expect(body).not.toContain('<script>k');
    expect(body).not.toContain('<img src=x');
    expect(body).toContain('&lt;script&gt;k&lt;/script&gt;');
    expect(body).toContain('&lt;img src=x onerror=alert(1)&gt;');
    await db.pool.query(`DELETE FROM outlive.limits WHERE key = '<script>k</script>'`);
  });
});

describe('cheap reads', () => {
  // Every statement the operator's reads send, by text, with its values.
  const seen = new Map<string, unknown[]>();
  const query = pg.Client.prototype.query;
  afterAll(() => {
    pg.Client.prototype.query = query;
  });

  it('reach the waiting tasks through tasks_blocked_idx, never by reading outlive.tasks whole', { timeout: 60_000 }, async () => {
    // A table shaped like a busy one: many finished rows, many waiting for one key.
    await db.pool.query(
      `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, state, finished_at)
       SELECT 'ops.done', '{}', 1, 1000, 'succeeded', now() FROM generate_series(1, 30000)`,
    );
    await db.pool.query(
      `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, fair_key, vt, limits, blocked_on)
       SELECT 'ops.call', '{}', 1, 1000, '', g, '[{"k": "openai", "n": 2}]', 'openai' FROM generate_series(1, 5000) g`,
    );
    await db.pool.query(`ANALYZE outlive.tasks`);
    const n = (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE blocked_on = 'openai' AND state = 'pending'`))[0]!.n;
    expect(n).toBeGreaterThan(5000);
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      const [first, second] = args as [unknown, unknown];
      const text = typeof first === 'string' ? first : (first as { text?: string } | null)?.text;
      const values = Array.isArray(second) ? second : (first as { values?: unknown[] } | null)?.values;
      if (text && /blocked_on/.test(text)) seen.set(text, values ?? []);
      return (query as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof query;
    try {
      const s = await status(db.pool);
      expect(s.waits.find((w) => w.key === 'openai')).toMatchObject({ waiting: n, waitingMore: false });
      await page('/limits');
      await explainRun(db.pool, (await db.rows<{ id: string }>(`SELECT id::text FROM outlive.runs ORDER BY id DESC LIMIT 1`))[0]!.id);
    } finally {
      pg.Client.prototype.query = query;
    }
    expect(seen.size).toBeGreaterThanOrEqual(2);
    for (const [text, values] of seen) {
      const [{ 'QUERY PLAN': plan }] = (await db.pool.query(`EXPLAIN (FORMAT JSON) ${text}`, values)).rows as [{ 'QUERY PLAN': unknown }];
      const scans: string[] = [];
      const walk = (node: Record<string, unknown>) => {
        if (node['Relation Name'] === 'tasks') scans.push(`${node['Node Type']} ${node['Index Name'] ?? ''}`.trim());
        for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
      };
      walk((plan as { Plan: Record<string, unknown> }[])[0]!.Plan);
      const onTasks = scans.filter((s) => !/ tasks_pkey$/.test(s));
      if (text.includes('FROM outlive.tasks t LEFT JOIN outlive.queue_pauses')) continue; // explainRun's own read of a run's tasks
      expect(onTasks.length, text).toBeGreaterThan(0);
      for (const scan of onTasks) expect(scan, text).toMatch(/^Index (Only )?Scan tasks_blocked_idx$/);
    }
  });
});
