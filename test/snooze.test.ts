/**
 * Snooze (issue 27): a handler says "not yet" with SnoozeError or
 * ctx.snooze; the task goes back to pending for the delay without spending
 * an attempt, at most MAX_SNOOZES times, in the statement that settles it.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, limitStatus, SnoozeError, startRun, step, tick } from '../src/index.js';
import { MAX_SNOOZES } from '../src/model/task.js';
import { getTask } from '../src/admin/queries.js';
import { freshDb } from './support/db.js';
import { taskRow } from './support/tasks.js';

const db = await freshDb();
const T0 = new Date(Date.now() + 3_600_000);
const at = (ms: number) => new Date(T0.getTime() + ms);

const job = z.object({ job: z.string(), readyAfter: z.number() });

/** A handler that is not ready until its `readyAfter`-th look. */
function poller(name: string, limits?: Parameters<typeof defineTask<typeof job, unknown>>[0]['limits']) {
  const looks = new Map<string, number>();
  const task = defineTask({
    name,
    input: job,
    retry: { maxAttempts: 1 },
    ...(limits ? { limits } : {}),
    run({ job, readyAfter }, ctx) {
      const n = (looks.get(job) ?? 0) + 1;
      looks.set(job, n);
      if (n < readyAfter) ctx.snooze(30_000);
      return { job, looks: n };
    },
  });
  return { task, looks };
}

/** Never ready. */
const NEVER = 1e9;

describe('snooze', () => {
  it('puts the task back for its delay without spending an attempt, and writes no error', async () => {
    const { task } = poller('poll');
    const { id } = await enqueue(db.pool, task, { job: 'a', readyAfter: 3 }, { runAt: at(0) });
    // maxAttempts 1: a snooze that spent an attempt would fail it here.
    expect(await tick(db.pool, { tasks: [task], now: at(0) })).toMatchObject({ claimed: 1, snoozed: 1, retried: 0, failed: 0 });
    let row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'pending', attempts: 1, max_attempts: 2, snoozes: 1, last_error: null, errors: [] });
    expect(new Date(row.run_at).getTime()).toBe(at(30_000).getTime());
    expect((await getTask(db.pool, id))!.waiting).toBe(`snoozed until ${at(30_000).toISOString()} (1 of ${MAX_SNOOZES})`);
    expect(await tick(db.pool, { tasks: [task], now: at(29_999) })).toMatchObject({ claimed: 0 });
    expect(await tick(db.pool, { tasks: [task], now: at(30_000) })).toMatchObject({ claimed: 1, snoozed: 1 });
    expect(await tick(db.pool, { tasks: [task], now: at(60_000) })).toMatchObject({ claimed: 1, succeeded: 1 });
    row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'succeeded', attempts: 3, max_attempts: 3, snoozes: 2, output: { job: 'a', looks: 3 } });
  });

  it('takes a time, and a thrown SnoozeError the same as ctx.snooze', async () => {
    let first = true;
    const task = defineTask({
      name: 'until',
      input: z.object({}),
      run() {
        if (first) {
          first = false;
          throw new SnoozeError(at(90_000));
        }
        return 'ok';
      },
    });
    const { id } = await enqueue(db.pool, task, {}, { runAt: at(0) });
    await tick(db.pool, { tasks: [task], now: at(0) });
    expect(new Date((await taskRow(db.pool, id)).run_at).getTime()).toBe(at(90_000).getTime());
  });

  it(`fails a task at its ${MAX_SNOOZES + 1}th snooze, saying so, so a bug cannot loop forever`, async () => {
    const { task } = poller('poll-forever');
    const { id } = await enqueue(db.pool, task, { job: 'b', readyAfter: NEVER }, { runAt: at(0) });
    // As if it had snoozed all but one of its snoozes.
    await db.pool.query(`UPDATE outlive.tasks SET snoozes = $2, max_attempts = 1 + $2 WHERE id = $1`, [id, MAX_SNOOZES - 1]);
    expect(await tick(db.pool, { tasks: [task], now: at(0) })).toMatchObject({ snoozed: 1 });
    expect(await tick(db.pool, { tasks: [task], now: at(30_000) })).toMatchObject({ snoozed: 0, failed: 1 });
    const row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'failed', snoozes: MAX_SNOOZES, last_error: `snoozed more than ${MAX_SNOOZES} times (the last: snoozed for 30000 ms)` });
    expect(row.errors).toHaveLength(1);
    expect(row.finished_at).not.toBeNull();
  });

  it('in a run: a snoozed step is waited for, and one snoozed too often fails its run', async () => {
    const { task } = poller('poll-step');
    const after = defineTask({ name: 'after-poll', input: z.object({}), run: () => 'after' });
    const ok = await startRun(db.pool, 'snoozing', { poll: step(task, { job: 'c', readyAfter: 2 }), next: step(after, {}, { after: ['poll'] }) });
    const tasks = [task, after];
    await tick(db.pool, { tasks, now: at(0) });
    expect((await db.pool.query(`SELECT state::text FROM outlive.runs WHERE id = $1`, [ok.id])).rows[0].state).toBe('running');
    await tick(db.pool, { tasks, now: at(30_000) });
    await tick(db.pool, { tasks, now: at(30_001) });
    expect((await db.pool.query(`SELECT state::text FROM outlive.runs WHERE id = $1`, [ok.id])).rows[0].state).toBe('succeeded');

    const bad = await startRun(db.pool, 'snoozing', { poll: step(task, { job: 'd', readyAfter: NEVER }), next: step(after, {}, { after: ['poll'] }) });
    await db.pool.query(`UPDATE outlive.tasks SET snoozes = $2, max_attempts = 1 + $2 WHERE run_id = $1 AND step = 'poll'`, [bad.id, MAX_SNOOZES]);
    expect(await tick(db.pool, { tasks, now: at(60_000) })).toMatchObject({ failed: 1 });
    const states = (await db.pool.query(`SELECT step, state::text FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [bad.id])).rows;
    expect(states).toEqual([{ step: 'next', state: 'skipped' }, { step: 'poll', state: 'failed' }]);
    expect((await db.pool.query(`SELECT state::text FROM outlive.runs WHERE id = $1`, [bad.id])).rows[0].state).toBe('failed');
  });

  it('gives back its slot and keeps its rate start: the call it made to look was a start', async () => {
    const { task } = poller('poll-limited', [{ key: 'prov', concurrency: 1 }, { key: 'prov-rate', rate: { limit: 10, periodMs: 60_000 } }]);
    const { id } = await enqueue(db.pool, task, { job: 'e', readyAfter: 2 }, { runAt: at(0) });
    expect(await tick(db.pool, { tasks: [task], now: at(0) })).toMatchObject({ snoozed: 1 });
    expect(await limitStatus(db.pool, ['prov'])).toEqual([expect.objectContaining({ key: 'prov', running: 0 })]);
    const [rate] = (await db.pool.query(`SELECT jsonb_array_length(starts) AS n FROM outlive.limits WHERE key = 'prov-rate'`)).rows;
    expect(rate.n).toBe(1);
    expect(await tick(db.pool, { tasks: [task], now: at(30_000) })).toMatchObject({ succeeded: 1 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', snoozes: 1 });
  });

  it('refuses a delay that is not one', () => {
    expect(() => new SnoozeError(-1)).toThrow(TypeError);
    expect(() => new SnoozeError(Number.NaN)).toThrow(/give a delay in milliseconds from 0 to 86400000/);
    expect(() => new SnoozeError(new Date('nope'))).toThrow(TypeError);
    expect(() => new SnoozeError(86_400_001)).toThrow(TypeError);
  });
});
