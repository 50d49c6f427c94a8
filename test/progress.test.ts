/**
 * Progress (issue 27): `ctx.progress` stored on the running attempt's row,
 * at most once a second, shown by explainRun, getTask, the CLI and the
 * dashboard; only the attempt that holds the row writes it.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, explainRun, startRun, step, tick } from '../src/index.js';
import { getTask } from '../src/admin/queries.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

/** A task whose handler reports progress, then waits at each gate the test opens. */
function gated(name: string, script: (ctx: { progress: (p: unknown) => Promise<void> }, gate: () => Promise<void>) => Promise<void>) {
  const gates: (() => void)[] = [];
  let arrived = 0;
  const gate = () => new Promise<void>((r) => { arrived++; gates.push(r); });
  const task = defineTask({ name, input: z.object({}), timeoutMs: 20_000, run: (_i, ctx) => script(ctx as never, gate) });
  const at = async (n: number) => { while (arrived < n) await new Promise((r) => setTimeout(r, 5)); };
  return { task, open: () => gates.shift()!(), at };
}

describe('ctx.progress', () => {
  it('is stored on the row at most once a second, the last call of a second written when it ends, and shown by explainRun and getTask', async () => {
    const { task, open, at } = gated('pages', async (ctx, gate) => {
      await ctx.progress({ done: 120, total: 1000, note: 'pages' });
      await gate();
      await ctx.progress({ done: 200, total: 1000, note: 'pages' }); // within the second: kept
      await ctx.progress({ done: 300, total: 1000, note: 'pages' }); // replaces it
      await gate();
    });
    const run = await startRun(db.pool, 'import', { pages: step(task, {}) });
    const pass = tick(db.pool, { tasks: [task] });
    await at(1);
    const explained = await explainRun(db.pool, run.id);
    expect(explained!.tasks[0]!.progress).toMatchObject({ done: 120, total: 1000, note: 'pages' });
    expect(explained!.tasks[0]!.why).toMatch(/^running attempt 1 of 5 \(120 of 1000 pages\), lease until /);
    const id = explained!.tasks[0]!.id;
    open();
    await at(2);
    expect((await getTask(db.pool, id))!.progress).toMatchObject({ done: 120 });
    // The second is up: the last of the two is written, once.
    let seen = 120;
    for (let i = 0; i < 60 && seen === 120; i++) {
      await new Promise((r) => setTimeout(r, 50));
      seen = (await getTask(db.pool, id))!.progress!.done!;
    }
    expect(seen).toBe(300);
    open();
    expect(await pass).toMatchObject({ succeeded: 1 });
    expect((await getTask(db.pool, id))!.progress).toMatchObject({ done: 300, total: 1000, note: 'pages' });
  });

  it('refuses what is not progress, with the field it did not expect, and writes nothing', async () => {
    const errors: string[] = [];
    const task = defineTask({
      name: 'bad-progress',
      input: z.object({}),
      async run(_i, ctx) {
        for (const p of [{ done: -1 }, { done: Number.NaN }, { percent: 50 }, { note: 'x'.repeat(501) }, null]) {
          try {
            await ctx.progress(p as never);
          } catch (err) {
            errors.push((err as Error).message);
          }
        }
      },
    });
    const run = await startRun(db.pool, 'bad', { only: step(task, {}) });
    expect(await tick(db.pool, { tasks: [task] })).toMatchObject({ succeeded: 1 });
    expect(errors).toHaveLength(5);
    expect(errors[0]).toMatch(/ctx\.progress done must be a finite number >= 0, got -1/);
    expect(errors[2]).toMatch(/unknown field\(s\) percent: use done, total, note/);
    const [t] = (await explainRun(db.pool, run.id))!.tasks;
    expect(t!.progress).toBeNull();
  });
});
