import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, tick } from '../src/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

describe('tick', () => {
  it('is enqueued in a transaction, claimed by a pass and its output stored', async () => {
    const double = defineTask({
      name: 'double',
      input: z.object({ n: z.number() }),
      run: ({ n }) => ({ doubled: n * 2 }),
    });
    const client = await db.pool.connect();
    await client.query('BEGIN');
    const t = await enqueue(client, double, { n: 21 });
    await client.query('COMMIT');
    client.release();
    const report = await tick(db.pool, { tasks: [double] });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1, failed: 0, retried: 0, stoppedBy: 'drained' });
    const [row] = await db.rows(`SELECT state::text, output, attempts FROM outlive.tasks WHERE id = $1`, [t.id]);
    expect(row).toEqual({ state: 'succeeded', output: { doubled: 42 }, attempts: 1 });
  });
});

describe('tick configuration', () => {
  it('refuses a budget that can fit none of its tasks, naming the fix', async () => {
    const slow = defineTask({ name: 'slow-config', input: z.object({}), timeoutMs: 5_000, run: () => 1 });
    await expect(tick(db.pool, { tasks: [slow], budgetMs: 5_000 })).rejects.toThrow(
      /can claim none of its tasks: the shortest timeoutMs is 5000 ms. Raise budgetMs/,
    );
    await expect(tick(db.pool, { tasks: [slow], concurrency: 0 })).rejects.toThrow(/concurrency must be a whole number >= 1/);
  });

  it('refuses two different tasks under one name', async () => {
    const a = defineTask({ name: 'twin', input: z.object({}), run: () => 1 });
    const b = defineTask({ name: 'twin', input: z.object({}), run: () => 2 });
    await expect(tick(db.pool, { tasks: [a, b] })).rejects.toThrow(/two tasks are named "twin"/);
  });
});

describe('shutting a pass down', () => {
  it('stops claiming on signal, then hands running tasks back on abort without counting the attempt', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    let started = 0;
    const slow = defineTask({
      name: 'slow-shutdown',
      input: z.object({ i: z.number() }),
      timeoutMs: 10_000,
      run: ({ i }, ctx) =>
        new Promise((resolve, reject) => {
          started++;
          if (i === 0) setTimeout(() => resolve('quick'), 20);
          ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason));
        }),
    });
    for (let i = 0; i < 5; i++) await enqueue(db.pool, slow, { i });
    const stopClaiming = new AbortController();
    const abort = new AbortController();
    const pass = tick(db.pool, { tasks: [slow], concurrency: 3, prefetch: 0, signal: stopClaiming.signal, abort: abort.signal });
    while (started < 3) await new Promise((r) => setTimeout(r, 5));
    stopClaiming.abort();
    await new Promise((r) => setTimeout(r, 100));
    abort.abort();
    const report = await pass;
    expect(report).toMatchObject({ claimed: 3, succeeded: 1, released: 2, retried: 0, failed: 0, stoppedBy: 'signal' });
    const rows = await db.rows<{ state: string; attempts: number; n: number }>(
      `SELECT state::text, attempts, count(*)::int AS n FROM outlive.tasks GROUP BY 1, 2 ORDER BY 1, 2`,
    );
    expect(rows).toEqual([
      { state: 'pending', attempts: 0, n: 4 },
      { state: 'succeeded', attempts: 1, n: 1 },
    ]);
  });
});

describe('prefetch', () => {
  it('hands back prefetched tasks that waited too long for a slot, unstarted and uncounted; nothing runs twice', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    const runs = new Map<number, number>();
    const slowish = defineTask({
      name: 'slowish',
      input: z.object({ i: z.number() }),
      timeoutMs: 1_000,
      run: async ({ i }) => {
        runs.set(i, (runs.get(i) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, 60));
      },
    });
    for (let i = 0; i < 8; i++) await enqueue(db.pool, slowish, { i });
    // A grace of 100 ms makes a prefetched task stale after 50 ms in the buffer.
    const first = await tick(db.pool, { tasks: [slowish], concurrency: 1, prefetch: 4, leaseGraceMs: 100 });
    expect(first.released).toBeGreaterThan(0);
    expect(first.succeeded).toBe(first.claimed);
    const [{ n }] = (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'pending' AND attempts = 0`)) as [{ n: number }];
    expect(n).toBe(8 - first.succeeded);
    // Later passes (no prefetch) run the rest, each task once.
    for (let k = 0; k < 20 && (await tick(db.pool, { tasks: [slowish], prefetch: 0 })).claimed > 0; k++);
    expect([...runs.values()].every((c) => c === 1)).toBe(true);
    expect(runs.size).toBe(8);
  });

  it('refuses a negative prefetch', async () => {
    const t = defineTask({ name: 'p', input: z.object({}), run: () => 1 });
    await expect(tick(db.pool, { tasks: [t], prefetch: -1 })).rejects.toThrow(/prefetch must be a whole number >= 0/);
  });
});

describe('the task names a pass knows', () => {
  it('are recorded by the first pass of a process, and not touched again by the passes that follow within a minute', async () => {
    const named = defineTask({ name: 'announced', input: z.object({}), run: () => null });
    await tick(db.pool, { tasks: [named] });
    const first = await db.rows<{ seen_at: Date; xmin: string; xmax: string }>(`SELECT seen_at, xmin::text, xmax::text FROM outlive.known_tasks WHERE name = 'announced'`);
    expect(first).toHaveLength(1);
    for (let i = 0; i < 3; i++) await tick(db.pool, { tasks: [named] });
    // Not rewritten, and not even locked (an ON CONFLICT that updates nothing still locks the row).
    expect(await db.rows(`SELECT seen_at, xmin::text, xmax::text FROM outlive.known_tasks WHERE name = 'announced'`)).toEqual([{ ...first[0], xmax: '0' }]);
  });
});

describe('a pass that returns', () => {
  // A lease check in flight when the last task settled went on after tick()
  // resolved: on a serverless platform the pool is closed right then, and a
  // test's cleanup deadlocked against the late heartbeat.
  it('has no query of its own still in flight, its lease checks included', async () => {
    let inFlight = 0;
    let heartbeats = 0;
    const slowHeartbeats = {
      query: async (...args: Parameters<typeof db.pool.query>) => {
        inFlight++;
        try {
          const text = typeof args[0] === 'string' ? args[0] : (args[0] as { text: string }).text;
          if (text.includes('outlive.leases') || text.includes('t.lease_owner = $2')) {
            heartbeats++;
            await new Promise((r) => setTimeout(r, 250));
          }
          return await (db.pool.query as (...a: unknown[]) => Promise<unknown>)(...args);
        } finally {
          inFlight--;
        }
      },
      connect: () => db.pool.connect(),
    } as unknown as typeof db.pool;
    const slow = defineTask({ name: 'slow-beat', input: z.object({}), run: () => new Promise((r) => setTimeout(() => r('done'), 300)) });
    await enqueue(db.pool, slow, {});
    const report = await tick(slowHeartbeats, { tasks: [slow], leaseCheckMs: 100 });
    expect(report.succeeded).toBe(1);
    expect(heartbeats).toBeGreaterThan(0);
    expect(inFlight).toBe(0);
  });
});

describe('a pass that nothing can wake (cron, webhook)', () => {
  it('runs what its last task enqueued, though a claim was in flight when that task finished', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    // Claims after the first run against the database at once, but their
    // rows reach the pass only when `release` is called: a claim whose
    // snapshot came before the enqueue below and whose answer came after it.
    let heldClaim: (() => void) | null = null;
    let claimHeld: () => void = () => {};
    const claimIsHeld = new Promise<void>((resolve) => (claimHeld = resolve));
    let claims = 0;
    const pool = {
      connect: () => db.pool.connect(),
      async query(textOrConfig: string | { text: string }, values?: unknown[]) {
        const text = typeof textOrConfig === 'string' ? textOrConfig : textOrConfig.text;
        const result = await db.pool.query(textOrConfig as never, values as never);
        if (text.includes('outlive.claim_tasks') && ++claims === 2) {
          await new Promise<void>((resolve) => {
            heldClaim = resolve;
            claimHeld();
          });
        }
        return result;
      },
    };
    const followUp = defineTask({ name: 'follow-up', input: z.object({}), run: () => 'done' });
    const quick = defineTask({ name: 'quick', input: z.object({}), run: () => 'quick' });
    const fanOut = defineTask({
      name: 'fan-out',
      input: z.object({}),
      async run() {
        // The pass asks again once `quick` has finished; that claim finds nothing yet.
        await claimIsHeld;
        await enqueue(db.pool, followUp, {});
        setTimeout(() => heldClaim!(), 100);
        return 'fanned out';
      },
    });
    await enqueue(db.pool, quick, {});
    await enqueue(db.pool, fanOut, {});
    const report = await tick(pool, { tasks: [quick, fanOut, followUp], recover: false });
    expect(report).toMatchObject({ claimed: 3, succeeded: 3 });
  });
});
