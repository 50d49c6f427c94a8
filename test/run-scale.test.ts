/**
 * Runs of 100,000 steps are linear in the engine (issue 28): a step spawned
 * after 100,000 others, and a chain of 20,000 spawned under a failed step,
 * cost at most 12x what a tenth of them costs. Ratios of the same work at
 * two sizes, not timed assertions: the machine's speed cancels out.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, NonRetriableError, startRun, step, tick, type AnyTask, type Step } from '../src/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
const later = new Date(Date.now() + 86_400_000);

const idle = defineTask({ name: 'scale-idle', input: z.object({ i: z.number() }), run: () => null });

const reset = () => db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks; DELETE FROM outlive.task_deps');

/** The pass that runs `spawner` once (its spawns written in its settle), and its wall time. */
async function timedPass(spawner: AnyTask) {
  const started = performance.now();
  const report = await tick(db.pool, { tasks: [spawner], maxTasks: 1, budgetMs: 300_000, concurrency: 1 });
  return { report, ms: performance.now() - started };
}

async function settleMs(spawner: AnyTask, steps: Record<string, Step>): Promise<number> {
  await reset();
  await startRun(db.pool, 'scale', steps);
  await db.pool.query('VACUUM ANALYZE outlive.tasks');
  const { report, ms } = await timedPass(spawner);
  expect(report.claimed).toBe(1);
  return ms;
}

describe('a run of 100,000 steps', () => {
  it('spawns a step after 100,000 others at most 12x the cost of one after 10,000', async () => {
    let n = 0;
    const spawner = defineTask({
      name: 'scale-fan-in',
      input: z.object({}),
      run(_i, ctx) {
        ctx.spawn('join', step(idle, { i: -1 }, { after: Array.from({ length: n }, (_, i) => `leaf:${i}`) }));
      },
    });
    const run = (size: number) => {
      n = size;
      const steps: Record<string, Step> = { root: step(spawner, {}) };
      for (let i = 0; i < size; i++) steps[`leaf:${i}`] = step(idle, { i }, { runAt: later });
      return settleMs(spawner, steps);
    };
    // The largest run: the spawner and 99,999 steps before the one it spawns.
    const small = await run(9_999);
    const large = await run(99_999);
    const [join] = await db.rows<{ waiting_on: number }>(`SELECT waiting_on FROM outlive.tasks WHERE step = 'join'`);
    expect(join).toEqual({ waiting_on: 99_999 });
    expect(large / small, `${Math.round(small)} ms for 9,999, ${Math.round(large)} ms for 99,999`).toBeLessThanOrEqual(12);
  }, 300_000);

  it('writes a chain of 20,000 spawned under a failed step, all skipped, at most 12x the cost of 2,000', async () => {
    let n = 0;
    const spawner = defineTask({
      name: 'scale-chain',
      input: z.object({}),
      run(_i, ctx) {
        // Listed last first: each step's predecessor comes after it.
        for (let i = n - 1; i >= 0; i--) ctx.spawn(`c:${i}`, step(idle, { i }, { after: [i === 0 ? 'broken' : `c:${i - 1}`] }));
      },
    });
    const broken = defineTask({ name: 'scale-broken', input: z.object({}), retry: { maxAttempts: 1 }, run: () => { throw new NonRetriableError('no'); } });
    const run = async (size: number) => {
      n = size;
      await reset();
      await startRun(db.pool, 'scale', { broken: step(broken, {}), root: step(spawner, {}, { after: [] }) });
      expect(await tick(db.pool, { tasks: [broken], maxTasks: 1 })).toMatchObject({ failed: 1 });
      const { report, ms } = await timedPass(spawner);
      expect(report, JSON.stringify(await db.rows(`SELECT last_error FROM outlive.tasks WHERE step = 'root'`))).toMatchObject({ succeeded: 1 });
      return ms;
    };
    const small = await run(2_000);
    const large = await run(20_000);
    const [counts] = await db.rows<{ skipped: number }>(`SELECT count(*) FILTER (WHERE state = 'skipped')::int AS skipped FROM outlive.tasks WHERE step LIKE 'c:%'`);
    expect(counts).toEqual({ skipped: 20_000 });
    expect(large / small, `${Math.round(small)} ms for 2,000, ${Math.round(large)} ms for 20,000`).toBeLessThanOrEqual(12);
  }, 300_000);
});
