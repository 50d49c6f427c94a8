import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { cancelRun, defineTask, enqueue, NonRetriableError, retryRun, retryTask, startRun, step, tick } from '../src/index.js';
import { freshDb } from './support/db.js';
import { taskRow } from './support/tasks.js';

const db = await freshDb();
let broken = true;
const flaky = defineTask({
  name: 'fixable',
  input: z.object({ label: z.string() }),
  retry: { maxAttempts: 2, backoff: () => 0 },
  run: ({ label }) => {
    if (broken && label.startsWith('bad')) throw new NonRetriableError(`${label} is broken`);
    return label;
  },
});

async function drain() {
  for (let i = 0; i < 50; i++) if ((await tick(db.pool, { tasks: [flaky] })).claimed === 0) return;
}

describe('retryTask', () => {
  it('puts a failed task back with fresh attempts, keeping its error history', async () => {
    broken = true;
    const t = await enqueue(db.pool, flaky, { label: 'bad-1' });
    await drain();
    expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'failed', attempts: 1 });
    broken = false;
    expect(await retryTask(db.pool, t.id)).toEqual({ retried: true, state: 'pending', tasks: 1 });
    await drain();
    const row = await taskRow(db.pool, t.id);
    expect(row).toMatchObject({ state: 'succeeded', attempts: 1, output: 'bad-1' });
    expect(row.errors).toHaveLength(1);
  });

  it('leaves tasks that did not fail alone, and says why', async () => {
    broken = false;
    const t = await enqueue(db.pool, flaky, { label: 'ok' });
    expect(await retryTask(db.pool, t.id)).toMatchObject({ retried: false, state: 'pending', reason: 'the task is pending, not failed or cancelled' });
    await drain();
    expect(await retryTask(db.pool, t.id)).toMatchObject({ retried: false, state: 'succeeded' });
    expect(await retryTask(db.pool, '987654321')).toMatchObject({ retried: false, state: null });
  });
});

describe('retryRun', () => {
  it('revives the failed and skipped tasks of a failed run; succeeded ones are not run again', async () => {
    broken = true;
    const run = await startRun(db.pool, 'retry-me', {
      a: step(flaky, { label: 'a' }),
      b: step(flaky, { label: 'bad-b' }, { after: ['a'] }),
      c: step(flaky, { label: 'c' }, { after: ['b'] }),
    });
    await drain();
    const states = async () =>
      (await db.rows<{ step: string; state: string; attempts: number }>(
        `SELECT step, state::text, attempts FROM outlive.tasks WHERE run_id = $1 ORDER BY step`,
        [run.id],
      )).map((r) => `${r.step}:${r.state}:${r.attempts}`);
    expect(await states()).toEqual(['a:succeeded:1', 'b:failed:1', 'c:skipped:0']);
    broken = false;
    expect(await retryRun(db.pool, run.id)).toEqual({ retried: true, state: 'running', tasks: 2 });
    const [waiting] = await db.rows<{ waiting_on: number }>(`SELECT waiting_on FROM outlive.tasks WHERE run_id = $1 AND step = 'c'`, [run.id]);
    expect(waiting!.waiting_on).toBe(1);
    await drain();
    expect(await states()).toEqual(['a:succeeded:1', 'b:succeeded:1', 'c:succeeded:1']);
    const [r] = await db.rows(`SELECT state::text, unfinished, failed_task_id FROM outlive.runs WHERE id = $1`, [run.id]);
    expect(r).toEqual({ state: 'succeeded', unfinished: 0, failed_task_id: null });
    expect(await retryRun(db.pool, run.id)).toMatchObject({ retried: false, state: 'succeeded' });
  });

  it('retries a run through any of its failed tasks, and a cancelled run too', async () => {
    broken = true;
    const run = await startRun(db.pool, 'via-task', { x: step(flaky, { label: 'bad-x' }), y: step(flaky, { label: 'y' }, { after: ['x'] }) });
    await drain();
    broken = false;
    expect(await retryTask(db.pool, run.tasks.x!)).toEqual({ retried: true, state: 'running', tasks: 2 });
    await drain();
    expect((await db.rows(`SELECT state::text FROM outlive.runs WHERE id = $1`, [run.id]))[0]).toEqual({ state: 'succeeded' });

    const cancelled = await startRun(db.pool, 'cancelled', { p: step(flaky, { label: 'p' }) });
    await cancelRun(db.pool, cancelled.id);
    expect(await retryRun(db.pool, cancelled.id)).toEqual({ retried: true, state: 'running', tasks: 1 });
    await drain();
    expect((await db.rows(`SELECT state::text FROM outlive.runs WHERE id = $1`, [cancelled.id]))[0]).toEqual({ state: 'succeeded' });
  });

  it('refuses a run that is still running', async () => {
    const run = await startRun(db.pool, 'busy', { q: step(flaky, { label: 'q' }) });
    expect(await retryRun(db.pool, run.id)).toMatchObject({ retried: false, state: 'running', reason: expect.stringMatching(/still running/) });
    expect(await retryRun(db.pool, '99999999')).toMatchObject({ retried: false, state: null });
  });
});
