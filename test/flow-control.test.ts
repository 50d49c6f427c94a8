/**
 * Flow control (issue 26): per-key concurrency and rates enforced in the
 * claim, slots given back by the statement that settles, recovers or
 * cancels, a 429 pausing the key for every pass, fair turns between keys of
 * a queue, and limits, pauses and weights changed at run time.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  cancelRun,
  ConfigError,
  defineTask,
  enqueue,
  enqueueMany,
  InvalidEnqueueError,
  limitStatus,
  pauseKey,
  pauseQueue,
  RateLimitedError,
  recover,
  resumeKey,
  resumeQueue,
  setLimit,
  setWeight,
  startRun,
  step,
  tick,
} from '../src/index.js';
import { claim } from '../src/pass/claim.js';
import { readKeyStates } from '../src/admin/queries.js';
import { closePool, freshDb, passExecutor, type TestDb } from './support/db.js';

/** A clock the tests move by hand: rows are claimed and settled at these times. */
const T0 = new Date(Date.now() + 60_000);
const at = (ms: number) => new Date(T0.getTime() + ms);

/** What ran, and the most that ran at once, per key. */
function tracker() {
  const running = new Map<string, number>();
  const most = new Map<string, number>();
  const ran: string[] = [];
  return {
    ran,
    most,
    async hold(key: string, label: string, ms: number) {
      const n = (running.get(key) ?? 0) + 1;
      running.set(key, n);
      most.set(key, Math.max(most.get(key) ?? 0, n));
      ran.push(label);
      await new Promise((r) => setTimeout(r, ms));
      running.set(key, running.get(key)! - 1);
    },
  };
}

async function keyRow(db: TestDb, key: string) {
  const [row] = await db.rows<{ running: number; starts: [number, number, number, number][]; paused_until: Date | null; wake_at: Date | null }>(
    `SELECT running, starts, paused_until, wake_at FROM outlive.limits WHERE key = $1`,
    [key],
  );
  return row;
}

const request = (names: string[], now: Date | null, limit = 100) => ({
  owner: `test-${Math.random()}`,
  limit,
  maxTimeoutMs: 60_000,
  queues: null,
  names,
  leaseGraceMs: 1_000,
  leaseMs: 30_000,
  now,
});

describe('per-key concurrency', () => {
  it('never runs more than the limit of a key across concurrent passes, and gives every slot back', async () => {
    const db = await freshDb();
    const t = tracker();
    const ran: number[] = [];
    const call = defineTask({
      name: 'call-api',
      input: z.object({ n: z.number(), customer: z.string() }),
      limits: [
        { key: 'api', concurrency: 3 },
        { key: (i) => `import:${i.customer}`, concurrency: 1 },
      ],
      async run({ n, customer }) {
        ran.push(n);
        await Promise.all([t.hold('api', `${n}`, 15 + (n % 4) * 5), t.hold(`import:${customer}`, `${n}`, 15 + (n % 4) * 5)]);
      },
    });
    await enqueueMany(db.pool, call, Array.from({ length: 40 }, (_, n) => ({ n, customer: `c${n % 5}` })));
    const pools = Array.from({ length: 4 }, () => db.newPool({ max: 3 }));
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const reports = await Promise.all(pools.map((pool) => tick(pool, { tasks: [call], concurrency: 8, budgetMs: 20_000 })));
      if (reports.every((r) => r.claimed === 0)) break;
    }
    await Promise.all(pools.map(closePool));
    expect(ran.sort((a, b) => a - b)).toEqual(Array.from({ length: 40 }, (_, n) => n));
    expect(t.most.get('api')).toBe(3);
    for (let c = 0; c < 5; c++) expect(t.most.get(`import:c${c}`)).toBe(1);
    const keys = await db.rows<{ key: string; running: number }>(`SELECT key, running FROM outlive.limits ORDER BY key`);
    expect(keys.map((k) => k.running)).toEqual(keys.map(() => 0));
    expect(keys.map((k) => k.key)).toEqual(['api', 'import:c0', 'import:c1', 'import:c2', 'import:c3', 'import:c4']);
  });

  it('a claim takes only what fits and leaves the rest out of its way until a slot is given back', async () => {
    const db = await freshDb();
    const slow = defineTask({ name: 'slow', input: z.object({ n: z.number() }), limits: [{ key: 'k', concurrency: 2 }], run: () => undefined });
    await enqueueMany(db.pool, slow, Array.from({ length: 50 }, (_, n) => ({ n })));
    const exec = passExecutor(db.pool);
    const first = await claim(exec, request(['slow'], null));
    expect(first).toHaveLength(2);
    expect(first[0]!.limits).toEqual([{ k: 'k', n: 2 }]);
    // The others wait for the key: out of the claim's index, not read again.
    const [{ n: blocked }] = (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE blocked_on = 'k'`)) as [{ n: number }];
    expect(blocked).toBeGreaterThan(0);
    expect(await claim(exec, request(['slow'], null))).toHaveLength(0);
    expect(await db.rows(`SELECT 1 FROM outlive.limits WHERE key = 'k' AND wake_at = 'infinity'`)).toHaveLength(1);
    // The first settles: its slot comes back, and the key wakes its waiting tasks.
    const { settle } = await import('../src/pass/settle.js');
    const owner = (await db.rows<{ o: string }>(`SELECT lease_owner AS o FROM outlive.tasks WHERE id = $1`, [first[0]!.id]))[0]!.o;
    const settled = await settle(db.pool, owner, [{ id: first[0]!.id, runId: null, attempt: 1, governed: true, state: 'succeeded', output: null }], null);
    expect(settled).toHaveLength(1);
    const next = await claim(exec, request(['slow'], null));
    expect(next).toHaveLength(1);
    expect((await keyRow(db, 'k'))!.running).toBe(2);
  });

  it('gives the slot back when the task is settled, recovered or cancelled, and a stale settle gives back nothing', async () => {
    const db = await freshDb();
    let fail = false;
    const task = defineTask({
      name: 'guarded',
      input: z.object({ n: z.number() }),
      retry: { maxAttempts: 3 },
      limits: [{ key: 'g', concurrency: 1 }],
      timeoutMs: 1_000,
      run() {
        if (fail) throw new Error('boom');
      },
    });
    // Recovered: the pass died holding it.
    const { id } = await enqueue(db.pool, task, { n: 1 });
    const [claimed] = await claim(passExecutor(db.pool), request(['guarded'], T0));
    expect(claimed!.id).toBe(id);
    expect((await keyRow(db, 'g'))!.running).toBe(1);
    const report = await recover(db.pool, { now: at(10_000) });
    expect(report.retried).toBe(1);
    expect((await keyRow(db, 'g'))!.running).toBe(0);
    // The dead pass's late settle matches nothing and gives back nothing.
    const { settle } = await import('../src/pass/settle.js');
    const stale = await settle(db.pool, 'test-dead', [{ id, runId: null, attempt: 1, governed: true, state: 'succeeded', output: null }], at(10_000));
    expect(stale).toEqual([]);
    expect((await keyRow(db, 'g'))!.running).toBe(0);
    // Retried, it fails for good: its slot comes back with the settle. The
    // recovered attempt was an interruption, so the handler has its 3.
    fail = true;
    await tick(db.pool, { tasks: [task], now: at(20_000) });
    await tick(db.pool, { tasks: [task], now: at(40_000) });
    await tick(db.pool, { tasks: [task], now: at(60_000) });
    const [row] = await db.rows<{ state: string; attempts: number }>(`SELECT state::text, attempts FROM outlive.tasks WHERE id = $1`, [id]);
    expect(row).toEqual({ state: 'failed', attempts: 4 });
    expect((await keyRow(db, 'g'))!.running).toBe(0);
    // Cancelled while running: the cancel gives the slot back.
    const run = await startRun(db.pool, 'one', { a: step(task, { n: 2 }) });
    const [running] = await claim(passExecutor(db.pool), request(['guarded'], null));
    expect(running!.id).toBe(run.tasks.a);
    expect((await keyRow(db, 'g'))!.running).toBe(1);
    await cancelRun(db.pool, run.id);
    expect((await keyRow(db, 'g'))!.running).toBe(0);
  });

  it('a freed slot reaches a waiting task even when the task woken first cannot start (its queue is paused)', async () => {
    const db = await freshDb();
    const mk = (queue: string) => defineTask({ name: `k1-${queue}`, queue, input: z.object({ n: z.number() }), limits: [{ key: 'k1', concurrency: 1 }], run: () => undefined });
    const inDefault = mk('default');
    const inPaused = mk('q1');
    const names = ['k1-default', 'k1-q1'];
    const { settle } = await import('../src/pass/settle.js');
    await enqueue(db.pool, inDefault, { n: 0 });
    const [x] = await claim(passExecutor(db.pool), { ...request(names, null), owner: 'first' });
    await enqueue(db.pool, inPaused, { n: 1 });
    const b = await enqueue(db.pool, inDefault, { n: 2 });
    expect(await claim(passExecutor(db.pool), request(names, null))).toEqual([]);
    await pauseQueue(db.pool, 'q1');
    await settle(db.pool, 'first', [{ id: x!.id, runId: null, attempt: 1, governed: true, state: 'succeeded', output: null }], null);
    const next: string[] = [];
    for (let i = 0; i < 3 && next.length === 0; i++) next.push(...(await claim(passExecutor(db.pool), request(names, null))).map((t) => t.id));
    expect(next).toEqual([b.id]);
  });

  it('claims that write the same new keys wait in key order and cannot deadlock, with claim_tasks calling the governed claim twice in one transaction', async () => {
    const db = await freshDb();
    const mk = (name: string) => defineTask({ name, input: z.object({ k: z.string() }), limits: [{ key: (i) => i.k, concurrency: 100 }], run: () => undefined });
    // A's first look (24 rows for a claim of 1) finds keys a and c; its second, b too. B's finds b and c.
    await enqueueMany(db.pool, mk('dl.x'), [...Array.from({ length: 24 }, (_, n) => ({ k: n % 2 ? 'c' : 'a' })), { k: 'b' }]);
    await enqueueMany(db.pool, mk('dl.y'), [{ k: 'b' }, { k: 'c' }]);
    // As claim_tasks calls it: keys written in the first call of a transaction only.
    const call = (names: string, writeKeys: boolean) =>
      `SELECT id FROM outlive.claim_governed(NULL, 60000, NULL, 1, 'dl', 1000, 30000, ARRAY['${names}'], ${writeKeys})`;
    const [a, b] = [await db.pool.connect(), await db.pool.connect()];
    try {
      await a.query('BEGIN');
      await b.query('BEGIN');
      expect((await a.query(call('dl.x', true))).rows).toHaveLength(1);
      // B writes b, then waits for A's uncommitted c.
      const second = b.query(call('dl.y', true)).then((r) => r.rows.length, (e: Error) => e);
      await new Promise((r) => setTimeout(r, 300));
      // A's second claim in the same transaction reaches b's rows: it must not wait for B.
      const third = await a.query(call('dl.x', false)).then((r) => r.rows.length, (e: Error) => e);
      expect(third).toBe(1);
      await a.query('COMMIT');
      expect(await second).toBe(1);
      await b.query('COMMIT');
    } finally {
      a.release();
      b.release();
    }
    const keys = await db.rows<{ key: string }>(`SELECT key FROM outlive.limits ORDER BY key`);
    expect(keys.map((k) => k.key)).toEqual(['a', 'b', 'c']);
  });

  it('a pass that hands back the tasks it runs (its abort) gives their slots back', async () => {
    const db = await freshDb();
    const slow = defineTask({
      name: 'held',
      input: z.object({ n: z.number() }),
      limits: [{ key: 'h', concurrency: 50 }],
      run: () => new Promise((r) => setTimeout(r, 2_000)),
    });
    await enqueueMany(db.pool, slow, Array.from({ length: 30 }, (_, n) => ({ n })));
    const stop = new AbortController();
    const handBack = new AbortController();
    setTimeout(() => {
      stop.abort();
      handBack.abort();
    }, 100);
    const report = await tick(db.pool, { tasks: [slow], concurrency: 5, signal: stop.signal, abort: handBack.signal });
    expect(report.released).toBe(5);
    const [row] = await db.rows<{ running: number; actual: number; attempts: number }>(
      `SELECT l.running, (SELECT count(*)::int FROM outlive.tasks WHERE state = 'running') AS actual,
              (SELECT sum(attempts)::int FROM outlive.tasks) AS attempts
       FROM outlive.limits l WHERE l.key = 'h'`,
    );
    expect(row).toEqual({ running: 0, actual: 0, attempts: 0 });
  });

  it('claims tasks with flow control only for free handlers: none waits in the pass’s buffer holding its slot and its turn', async () => {
    const db = await freshDb();
    const fair = defineTask({
      name: 'fair-only',
      input: z.object({ c: z.string(), n: z.number() }),
      fairness: { key: (i) => i.c },
      run: () => new Promise((r) => setTimeout(r, 15)),
    });
    const plain = defineTask({ name: 'plain', input: z.object({ n: z.number() }), run: () => new Promise((r) => setTimeout(r, 5)) });
    await enqueueMany(db.pool, fair, Array.from({ length: 40 }, (_, n) => ({ c: `c${n % 4}`, n })));
    await enqueueMany(db.pool, plain, Array.from({ length: 40 }, (_, n) => ({ n })));
    const report = await tick(db.pool, { tasks: [fair, plain], concurrency: 3, prefetch: 1_000, budgetMs: 20_000 });
    expect(report).toMatchObject({ claimed: 80, succeeded: 80, released: 0 });
    // A claim's rows share its started_at. Plain tasks may be claimed ahead
    // into the buffer; governed ones only as many as there are free handlers.
    const [{ most }] = (await db.rows<{ most: number }>(
      `SELECT max(x)::int AS most FROM (SELECT count(*) AS x FROM outlive.tasks WHERE name = 'fair-only' GROUP BY started_at) s`,
    )) as [{ most: number }];
    expect(most).toBeLessThanOrEqual(3);
  });

  it('a worker starts the next task of a full key when a slot is given back, not at its next poll', async () => {
    const db = await freshDb();
    const { createWorker } = await import('../src/node/index.js');
    const one = defineTask({ name: 'one-at-a-time', input: z.object({ n: z.number() }), limits: [{ key: 'one', concurrency: 1 }], run: () => new Promise((r) => setTimeout(r, 10)) });
    await enqueueMany(db.pool, one, Array.from({ length: 10 }, (_, n) => ({ n })));
    const quiet = { info: () => undefined, warn: () => undefined, error: () => undefined };
    const worker = createWorker({ connectionString: db.url, tasks: [one], pollIntervalMs: 600_000, logger: quiet });
    await worker.start();
    try {
      for (let i = 0; i < 100; i++) {
        const [{ n }] = (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'succeeded'`)) as [{ n: number }];
        if (n === 10) break;
        await new Promise((r) => setTimeout(r, 50));
      }
    } finally {
      await worker.stop();
    }
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE state <> 'succeeded'`)).toEqual([]);
  });

  it('a worker wakes when a rate lets the next start go, not at its next poll', async () => {
    const db = await freshDb();
    const { createWorker } = await import('../src/node/index.js');
    const starts: number[] = [];
    const paced = defineTask({
      name: 'paced',
      input: z.object({ n: z.number() }),
      limits: [{ key: 'pace', rate: { limit: 4, periodMs: 1_000, burst: 1 } }],
      run: () => void starts.push(performance.now()),
    });
    await enqueueMany(db.pool, paced, Array.from({ length: 4 }, (_, n) => ({ n })));
    const quiet = { info: () => undefined, warn: () => undefined, error: () => undefined };
    const worker = createWorker({ connectionString: db.url, tasks: [paced], pollIntervalMs: 600_000, logger: quiet });
    await worker.start();
    try {
      for (let i = 0; i < 100 && starts.length < 4; i++) await new Promise((r) => setTimeout(r, 50));
    } finally {
      await worker.stop();
    }
    expect(starts).toHaveLength(4);
    // 250 ms apart by the claims' clock (a loaded machine delays a handler's
    // start, not its claim): spread by the burst of 1, each woken by its key's
    // time, all within the 600-s poll.
    const claimed = (await db.rows<{ ms: number }>(`SELECT extract(epoch FROM started_at) * 1000 AS ms FROM outlive.tasks ORDER BY started_at`)).map((r) => Number(r.ms));
    for (let i = 1; i < claimed.length; i++) expect(claimed[i]! - claimed[i - 1]!).toBeGreaterThanOrEqual(249);
    expect(claimed[3]! - claimed[0]!).toBeLessThan(5_000);
  });

  it('wakes the tasks waiting for a key in the claim’s order: a task of higher priority does not wait behind the backlog', async () => {
    const db = await freshDb();
    const task = defineTask({ name: 'prio', input: z.object({ n: z.number() }), limits: [{ key: 'pk', concurrency: 1 }], run: () => undefined });
    const { settle } = await import('../src/pass/settle.js');
    await enqueueMany(db.pool, task, Array.from({ length: 20 }, (_, n) => ({ n })));
    const [first] = await claim(passExecutor(db.pool), { ...request(['prio'], null), owner: 'p' });
    expect(await claim(passExecutor(db.pool), request(['prio'], null))).toEqual([]);
    const urgent = await enqueue(db.pool, task, { n: 99 }, { priority: 10 });
    expect(await claim(passExecutor(db.pool), request(['prio'], null))).toEqual([]);
    expect((await db.rows<{ blocked_on: string }>(`SELECT blocked_on FROM outlive.tasks WHERE id = $1`, [urgent.id]))[0]!.blocked_on).toBe('pk');
    await settle(db.pool, 'p', [{ id: first!.id, runId: null, attempt: 1, governed: true, state: 'succeeded', output: null }], null);
    expect((await claim(passExecutor(db.pool), request(['prio'], null))).map((t) => t.id)).toEqual([urgent.id]);
  });

  it('takes a limit changed at run time at the next claim', async () => {
    const db = await freshDb();
    const task = defineTask({ name: 'tunable', input: z.object({ n: z.number() }), limits: [{ key: 't', concurrency: 5 }], run: () => undefined });
    await enqueueMany(db.pool, task, Array.from({ length: 10 }, (_, n) => ({ n })));
    await setLimit(db.pool, 't', { concurrency: 2 });
    expect(await claim(passExecutor(db.pool), request(['tunable'], null))).toHaveLength(2);
    await setLimit(db.pool, 't', { concurrency: null });
    expect(await claim(passExecutor(db.pool), request(['tunable'], null))).toHaveLength(3);
    expect(await limitStatus(db.pool, ['t'])).toEqual([
      expect.objectContaining({ key: 't', running: 5, concurrency: null, waiting: 5 }),
    ]);
  });
});

describe('rate limits', () => {
  it('never lets a window of the period hold more than the limit, and starts again as the window slides', async () => {
    const db = await freshDb();
    const task = defineTask({ name: 'rated', input: z.object({ n: z.number() }), limits: [{ key: 'r', rate: { limit: 3, periodMs: 60_000 } }], run: () => undefined });
    await enqueueMany(db.pool, task, Array.from({ length: 7 }, (_, n) => ({ n })));
    const started = async (ms: number) => (await tick(db.pool, { tasks: [task], now: at(ms) })).claimed;
    expect(await started(0)).toBe(3);
    expect(await started(30_000)).toBe(0);
    // The key wakes when the first start leaves the window, not before.
    expect((await keyRow(db, 'r'))!.wake_at?.getTime()).toBe(at(60_000).getTime());
    expect(await started(59_999)).toBe(0);
    expect(await started(60_001)).toBe(3);
    expect(await started(60_002)).toBe(0);
    expect(await started(120_002)).toBe(1);
  });

  it('spreads starts over the period with a burst, one emission interval per unit of cost, and says when the next fits', async () => {
    const db = await freshDb();
    const task = defineTask({ name: 'spread', input: z.object({ n: z.number() }), limits: [{ key: 's', rate: { limit: 3, periodMs: 60_000, burst: 1 } }], run: () => undefined });
    await enqueueMany(db.pool, task, Array.from({ length: 5 }, (_, n) => ({ n })));
    const started = async (ms: number) => (await tick(db.pool, { tasks: [task], now: at(ms) })).claimed;
    // 3 a minute, one at a time: 20 s apart, never the window's three at once.
    expect(await started(0)).toBe(1);
    expect((await keyRow(db, 's'))!.wake_at?.getTime()).toBe(at(20_000).getTime());
    const [status] = await readKeyStates(passExecutor(db.pool), [{ key: 's' }], { now: at(5_000) });
    expect(status).toMatchObject({ rate: { limit: 3, periodMs: 60_000, burst: 1 }, windowUsed: 1, nextStartAt: at(20_000) });
    expect(await started(19_999)).toBe(0);
    expect(await started(20_000)).toBe(1);
    // Late by 15 s: the lateness is not saved up for a burst.
    expect(await started(55_000)).toBe(1);
    expect(await started(74_999)).toBe(0);
    expect(await started(75_000)).toBe(1);
  });

  it('a burst lets that much cost start back to back, then spaces the rest by their cost, inside the window', async () => {
    const db = await freshDb();
    const task = defineTask({
      name: 'spread-tokens',
      input: z.object({ est: z.number() }),
      // 600 ms per token; 40 tokens may go back to back.
      limits: [{ key: 'tk', rate: { limit: 100, periodMs: 60_000, burst: 40 }, cost: (i) => i.est }],
      run: () => undefined,
    });
    await enqueueMany(db.pool, task, [{ est: 20 }, { est: 20 }, { est: 20 }, { est: 60 }, { est: 20 }]);
    const started = async (ms: number) => (await tick(db.pool, { tasks: [task], now: at(ms) })).claimed;
    expect(await started(0)).toBe(2);
    expect(await started(11_999)).toBe(0);
    expect(await started(12_000)).toBe(1);
    // 60 tokens, above the burst, may go only with nothing ahead of it (at 36 s); a start of 20 that fits goes past it (at 24 s).
    expect(await started(23_999)).toBe(0);
    expect(await started(24_000)).toBe(1);
    // Then the spacing allows it at 48 s, but the window does not: 80 tokens started since 0, and 80 + 60 > 100 until 0's leave it.
    expect(await started(48_000)).toBe(0);
    const [status] = await readKeyStates(passExecutor(db.pool), [{ key: 'tk' }], { now: at(48_000) });
    expect(status).toMatchObject({ windowUsed: 80, nextCost: 60, nextStartAt: at(60_000) });
    expect(await started(59_999)).toBe(0);
    expect(await started(60_000)).toBe(1);
  });

  it('reserves the estimated cost at the claim and corrects it with the reported cost at the settle', async () => {
    const db = await freshDb();
    const task = defineTask({
      name: 'tokens',
      input: z.object({ est: z.number(), used: z.number() }),
      limits: [{ key: 'tok', rate: { limit: 100, periodMs: 60_000 }, cost: (i) => i.est }],
      run({ used }, ctx) {
        ctx.reportCost(used);
      },
    });
    await enqueue(db.pool, task, { est: 60, used: 10 });
    await enqueue(db.pool, task, { est: 50, used: 50 });
    // 60 + 50 > 100: one starts.
    const [first, ...others] = await claim(passExecutor(db.pool), { ...request(['tokens'], at(0)), owner: 'p1' });
    expect(others).toEqual([]);
    expect((await keyRow(db, 'tok'))!.starts.map((s) => s[1])).toEqual([60]);
    // It used 10 (its handler's reportCost): the window holds 10, so the other fits now.
    const { execute } = await import('../src/pass/execute.js');
    const { settle } = await import('../src/pass/settle.js');
    const outcome = await execute(task, first!);
    expect(outcome).toMatchObject({ state: 'succeeded', governed: true, flow: JSON.stringify({ costs: { tok: 10 } }) });
    await settle(db.pool, 'p1', [outcome], at(1));
    expect((await keyRow(db, 'tok'))!.starts.map((s) => s[1])).toEqual([10]);
    expect((await tick(db.pool, { tasks: [task], now: at(1_000) })).claimed).toBe(1);
    expect((await keyRow(db, 'tok'))!.starts.map((s) => s[1])).toEqual([10, 50]);
    await expect(enqueue(db.pool, task, { est: 101, used: 0 })).rejects.toThrow(
      new InvalidEnqueueError('outlout: cannot enqueue "tokens": a start costing 101 can never fit the rate of key "tok" (100 per 60000 ms)'.replace('outlout', 'outlive')),
    );
  });

  it('a 429 pauses the key for every pass until its Retry-After, and the task waits without spending an attempt', async () => {
    const db = await freshDb();
    let refuse = true;
    const ran: number[] = [];
    const task = defineTask({
      name: 'provider',
      input: z.object({ n: z.number() }),
      retry: { maxAttempts: 2 },
      limits: [{ key: 'openai', concurrency: 5 }],
      run({ n }) {
        ran.push(n);
        if (refuse && n === 0) throw new RateLimitedError({ key: 'openai', retryAfterMs: 20_000 });
      },
    });
    const first = await enqueue(db.pool, task, { n: 0 });
    expect(await tick(db.pool, { tasks: [task], now: at(0) })).toMatchObject({ claimed: 1 });
    const [row] = await db.rows<{ state: string; attempts: number }>(`SELECT state::text, attempts FROM outlive.tasks WHERE id = $1`, [first.id]);
    expect(row).toEqual({ state: 'pending', attempts: 0 });
    expect((await keyRow(db, 'openai'))!.paused_until?.getTime()).toBe(at(20_000).getTime());
    await enqueue(db.pool, task, { n: 1 });
    refuse = false;
    expect((await tick(db.pool, { tasks: [task], now: at(10_000) })).claimed).toBe(0);
    expect((await tick(db.pool, { tasks: [task], now: at(19_999) })).claimed).toBe(0);
    expect((await tick(db.pool, { tasks: [task], now: at(20_001) })).claimed).toBe(2);
    expect(ran.sort()).toEqual([0, 0, 1]);
    expect((await keyRow(db, 'openai'))!.running).toBe(0);
  });

  it('pauseKey and resumeKey, by hand; a pause by hand never shortens a 429’s', async () => {
    const db = await freshDb();
    const task = defineTask({ name: 'pausable', input: z.object({}), limits: [{ key: 'p', concurrency: 1 }], run: () => undefined });
    const { settle } = await import('../src/pass/settle.js');
    await enqueue(db.pool, task, {});
    const [t] = await claim(passExecutor(db.pool), { ...request(['pausable'], null), owner: 'o' });
    const pause = { key: 'p', ms: 600_000, reason: 'rate limited on key "p": retry after 600000 ms' };
    await settle(db.pool, 'o', [{ id: t!.id, runId: null, attempt: 1, governed: true, flow: JSON.stringify({ pause }), state: 'released' }], null);
    await pauseKey(db.pool, 'p', { until: new Date(Date.now() + 60_000), reason: 'short' });
    const [status] = await limitStatus(db.pool, ['p']);
    expect(status).toMatchObject({ pausedBy: '429', pausedReason: pause.reason, waiting: 0 });
    expect(status!.pausedUntil!.getTime()).toBeGreaterThan(Date.now() + 500_000);
    expect(await resumeKey(db.pool, 'p')).toBe(true);
    expect((await tick(db.pool, { tasks: [task] })).claimed).toBe(1);
    await pauseKey(db.pool, 'p', { reason: 'provider incident' });
    expect((await limitStatus(db.pool, ['p']))[0]).toMatchObject({ pausedBy: 'hand', pausedReason: 'provider incident', pausedUntil: new Date(8.64e15) });
    await enqueue(db.pool, task, {});
    expect((await tick(db.pool, { tasks: [task] })).claimed).toBe(0);
    expect(await resumeKey(db.pool, 'p')).toBe(true);
    expect((await tick(db.pool, { tasks: [task] })).claimed).toBe(1);
  });
});

describe('queues', () => {
  it('pauseQueue stops every claim of the queue, with or without limits, until resumeQueue', async () => {
    const db = await freshDb();
    const plain = defineTask({ name: 'plain', input: z.object({}), queue: 'imports', run: () => undefined });
    const limited = defineTask({ name: 'limited', input: z.object({}), queue: 'imports', limits: [{ key: 'x', concurrency: 1 }], run: () => undefined });
    const other = defineTask({ name: 'other', input: z.object({}), run: () => undefined });
    await pauseQueue(db.pool, 'imports', { reason: 'deploying' });
    await enqueue(db.pool, plain, {});
    await enqueue(db.pool, limited, {});
    await enqueue(db.pool, other, {});
    expect((await tick(db.pool, { tasks: [plain, limited, other] })).claimed).toBe(1);
    expect(await resumeQueue(db.pool, 'imports')).toBe(true);
    expect((await tick(db.pool, { tasks: [plain, limited, other] })).claimed).toBe(2);
  });
});

describe('fair sharing', () => {
  const page = defineTask({
    name: 'page',
    input: z.object({ customer: z.string(), n: z.number() }),
    fairness: { key: (i) => i.customer },
    run: () => undefined,
  });
  const order = async (db: TestDb, limit: number) =>
    (await claim(passExecutor(db.pool), request(['page'], null, limit))).map((t) => (t.input as { customer: string }).customer);

  it('a key with a backlog does not delay a key with one task', async () => {
    const db = await freshDb();
    await enqueueMany(db.pool, page, Array.from({ length: 2_000 }, (_, n) => ({ customer: 'big', n })));
    expect(await order(db, 10)).toEqual(Array(10).fill('big'));
    await enqueue(db.pool, page, { customer: 'small', n: 0 });
    // One claim of two: the head of the backlog and the newcomer.
    expect((await order(db, 2)).sort()).toEqual(['big', 'small']);
  });

  it("a key's enqueue reads a few index pages however many ready rows another key holds", async () => {
    const db = await freshDb();
    await enqueueMany(db.pool, page, Array.from({ length: 20_000 }, (_, n) => ({ customer: 'big', n })));
    // Statistics that say one key holds every ready row: what a backlog's drain looks like to the planner.
    await db.rows('ANALYZE outlive.tasks');
    const client = await db.pool.connect();
    const pagesRead = async (key: string) => {
      const { rows } = await client.query<{ 'QUERY PLAN': [{ Plan: { 'Shared Hit Blocks': number; 'Shared Read Blocks': number } }] }>(
        `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM outlive.fair_start('default', $1)`,
        [key],
      );
      const { Plan } = rows[0]!['QUERY PLAN'][0];
      return Plan['Shared Hit Blocks'] + Plan['Shared Read Blocks'];
    };
    try {
      await pagesRead('warm'); // the connection's first call reads the catalog
      // Its turn: after its own last row (none), so at the queue's head: two probes, not a walk of 'big's rows.
      expect(await pagesRead('small')).toBeLessThan(50);
      expect(await pagesRead('big')).toBeLessThan(50);
    } finally {
      client.release();
    }
    await enqueue(db.pool, page, { customer: 'small', n: 0 });
    expect((await order(db, 2)).sort()).toEqual(['big', 'small']);
  });

  it('a claim locks only the rows it takes: a concurrent claim takes the very next in turn, not one ten rows on', async () => {
    const db = await freshDb();
    await enqueueMany(db.pool, page, Array.from({ length: 30 }, (_, n) => ({ customer: 'big', n })));
    await enqueue(db.pool, page, { customer: 'small', n: 0 });
    const held = await db.pool.connect();
    try {
      // A claim of one whose transaction is still open, as a pass's is while its statement runs.
      await held.query('BEGIN');
      const { rows: first } = await held.query<{ input: { customer: string; n: number } }>(
        `SELECT input FROM outlive.claim_tasks(NULL, 60000, NULL, 1, 'held', 1000, 30000, ARRAY['page'], 1)`,
      );
      expect(first.map((r) => r.input)).toEqual([{ customer: 'big', n: 0 }]);
      // The newcomer's turn is the head's: next in line, and no lock of the first claim stands in its way.
      const next = (await claim(passExecutor(db.pool), { ...request(['page'], null, 2), governedLimit: 2 })).map((t) => t.input);
      expect(next).toEqual([{ customer: 'small', n: 0 }, { customer: 'big', n: 1 }]);
    } finally {
      await held.query('ROLLBACK');
      held.release();
    }
  });

  it('serves weighted keys in proportion to their weights', async () => {
    const db = await freshDb();
    await setWeight(db.pool, 'default', 'gold', 3);
    await enqueueMany(db.pool, page, Array.from({ length: 100 }, (_, n) => ({ customer: 'gold', n })));
    await enqueueMany(db.pool, page, Array.from({ length: 100 }, (_, n) => ({ customer: 'free', n })));
    const got = await order(db, 80);
    // 3 turns to 1: 60 of 80, give or take the newcomer's first turn.
    expect(got.filter((c) => c === 'gold').length).toBeGreaterThanOrEqual(59);
    expect(got.filter((c) => c === 'gold').length).toBeLessThanOrEqual(61);
  });

  it('places steps of runs and retried tasks in turn when they become ready', async () => {
    const db = await freshDb();
    await enqueueMany(db.pool, page, Array.from({ length: 500 }, (_, n) => ({ customer: 'big', n })));
    const run = await startRun(db.pool, 'later', { s: step(page, { customer: 'late', n: 0 }) });
    const [row] = await db.rows<{ vt: number | null }>(`SELECT vt FROM outlive.tasks WHERE id = $1`, [run.tasks.s]);
    expect(row!.vt).toBeNull();
    expect((await order(db, 2)).sort()).toEqual(['big', 'late']);
  });
});

describe('debounce and throttle on idempotency keys', () => {
  const save = defineTask({ name: 'save-draft', input: z.object({ text: z.string() }), run: ({ text }) => text });
  const input = async (db: TestDb, id: string) =>
    (await db.rows<{ input: { text: string }; run_at: Date; state: string; key: string | null }>(`SELECT input, run_at, state::text, key FROM outlive.tasks WHERE id = $1`, [id]))[0]!;

  it("'replace' (debounce): the pending task takes the last input and the last run time", async () => {
    const db = await freshDb();
    const a = await enqueue(db.pool, save, { text: 'a' }, { key: 'doc-1', keyMode: 'replace', delayMs: 5_000 });
    const b = await enqueue(db.pool, save, { text: 'ab' }, { key: 'doc-1', keyMode: 'replace', delayMs: 10_000 });
    expect(b).toMatchObject({ id: a.id, deduplicated: true, replaced: true });
    const row = await input(db, a.id);
    expect(row.input).toEqual({ text: 'ab' });
    expect(row.run_at.getTime()).toBe(b.runAt.getTime());
    expect(b.runAt.getTime() - a.runAt.getTime()).toBeGreaterThan(4_000);
    expect(await db.rows(`SELECT 1 FROM outlive.tasks`)).toHaveLength(1);
  });

  it("'preserve_run_at' (throttle): the pending task takes the last input and keeps its time", async () => {
    const db = await freshDb();
    const a = await enqueue(db.pool, save, { text: 'a' }, { key: 'doc-1', keyMode: 'preserve_run_at', delayMs: 5_000 });
    const b = await enqueue(db.pool, save, { text: 'abc' }, { key: 'doc-1', keyMode: 'preserve_run_at', delayMs: 60_000 });
    expect(b).toMatchObject({ id: a.id, replaced: true });
    const row = await input(db, a.id);
    expect(row.input).toEqual({ text: 'abc' });
    expect(row.run_at.getTime()).toBe(a.runAt.getTime());
  });

  it('a running task keeps running and gives its key up to a new task with the new input', async () => {
    const db = await freshDb();
    const a = await enqueue(db.pool, save, { text: 'a' }, { key: 'doc-1' });
    await claim(passExecutor(db.pool), request(['save-draft'], null));
    const b = await enqueue(db.pool, save, { text: 'ab' }, { key: 'doc-1', keyMode: 'replace' });
    expect(b).toMatchObject({ deduplicated: false, replaced: false });
    expect(b.id).not.toBe(a.id);
    expect(await input(db, a.id)).toMatchObject({ state: 'running', key: null, input: { text: 'a' } });
    expect(await input(db, b.id)).toMatchObject({ state: 'pending', key: 'doc-1', input: { text: 'ab' } });
    // enqueueMany takes the mode too; without one, a key dedupes as before.
    const many = await enqueueMany(db.pool, save, [{ text: 'abc' }, { text: 'x' }], { key: (i) => (i.text === 'x' ? 'doc-2' : 'doc-1'), keyMode: 'replace' });
    expect(many.map((t) => t.replaced)).toEqual([true, false]);
    expect(await enqueue(db.pool, save, { text: 'zzz' }, { key: 'doc-1' })).toMatchObject({ id: b.id, deduplicated: true });
    expect((await input(db, b.id)).input).toEqual({ text: 'abc' });
    await expect(enqueue(db.pool, save, { text: 'a' }, { keyMode: 'replace' })).rejects.toThrow(/keyMode 'replace' needs a key/);
    await expect(enqueue(db.pool, save, { text: 'a' }, { key: 'k', keyMode: 'debounce' as never })).rejects.toThrow(/keyMode must be one of 'dedupe', 'replace', 'preserve_run_at'/);
  });
});

describe('bad input', () => {
  it('refuses limits that cannot work when the task is defined, and keys that cannot be computed at enqueue', async () => {
    const make = (limits: unknown) => () => defineTask({ name: 'bad', input: z.object({}), limits: limits as never, run: () => undefined });
    expect(make([{ key: 'a' }])).toThrow(new ConfigError('outlive: task "bad": limits[0] needs concurrency or rate'));
    expect(make([{ key: 'a', concurrency: 0 }])).toThrow(/concurrency must be a whole number from 1/);
    expect(make([{ key: 'a', concurency: 2 }])).toThrow(/unknown option\(s\) concurency/);
    expect(make([{ key: '', concurrency: 1 }])).toThrow(/key must be a non-empty string/);
    expect(make([{ key: 'a', concurrency: 1, cost: 3 }])).toThrow(/cost counts against a rate: give rate too/);
    expect(make([{ key: 'a', rate: { limit: 60, periodMs: 60_000, spread: true } }])).toThrow(
      new ConfigError('outlive: task "bad": limits[0].rate has unknown option(s) spread: use limit, periodMs, burst'),
    );
    expect(make([{ key: 'a', rate: { limit: 60, periodMs: 60_000, burst: 0 } }])).toThrow(/rate\.burst must be a number > 0/);
    const db = await freshDb();
    const keyed = defineTask({ name: 'keyed', input: z.object({ c: z.string() }), limits: [{ key: (i) => i.c, concurrency: 1 }], run: () => undefined });
    await expect(enqueue(db.pool, keyed, { c: '' })).rejects.toThrow(/limits\[0\]\.key must be a non-empty string/);
    await expect(setLimit(db.pool, 'k', { concurrency: -1 })).rejects.toThrow(/concurrency must be a whole number/);
    await expect(setLimit(db.pool, 'k', { conc: 1 } as never)).rejects.toThrow(/unknown option\(s\) conc/);
    expect(() => new RateLimitedError({ key: 'k', retryAfterMs: Number.NaN })).toThrow(/retryAfterMs must be a finite number/);
    expect(await db.rows(`SELECT * FROM outlive.tasks`)).toEqual([]);
  });
});
