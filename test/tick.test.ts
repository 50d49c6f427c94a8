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
