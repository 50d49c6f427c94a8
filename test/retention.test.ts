import { beforeEach, describe, expect, it } from 'vitest';
import { applyRetention, ConfigError } from '../src/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

const NOW = new Date('2025-06-30T12:00:00Z');
const DAY = 86_400_000;
const daysAgo = (d: number) => new Date(NOW.getTime() - d * DAY);

/** Inserts `count` tasks in `state`, finished `age` days before NOW (unfinished ones get no finished_at). */
async function insertTasks(label: string, state: string, ageDays: number | null, count = 1, runId: string | null = null): Promise<void> {
  await db.pool.query(
    `INSERT INTO outlive.tasks (name, state, input, max_attempts, timeout_ms, finished_at, run_id, step, lease_owner, lease_expires_at)
     SELECT $1, $2::outlive.task_state, '{}'::jsonb, 5, 1000, $3, $4::bigint,
            CASE WHEN $4::bigint IS NULL THEN NULL ELSE $1 || '-' || g END,
            CASE WHEN $2 = 'running' THEN 'pass:x' END,
            CASE WHEN $2 = 'running' THEN $6::timestamptz END
     FROM generate_series(1, $5) AS g`,
    [label, state, ageDays === null ? null : daysAgo(ageDays), runId, count, daysAgo(1)],
  );
}

async function insertRun(state: string, finishedDaysAgo: number | null, createdDaysAgo = (finishedDaysAgo ?? 0) + 1): Promise<string> {
  const { rows } = await db.pool.query<{ id: string }>(
    `INSERT INTO outlive.runs (name, state, created_at, finished_at) VALUES ('r', $1::outlive.run_state, $2, $3) RETURNING id::text`,
    [state, daysAgo(createdDaysAgo), finishedDaysAgo === null ? null : daysAgo(finishedDaysAgo)],
  );
  return rows[0]!.id;
}

async function countTasks(): Promise<Record<string, number>> {
  const rows = await db.rows<{ name: string; n: number }>(`SELECT name, count(*)::int AS n FROM outlive.tasks GROUP BY name`);
  return Object.fromEntries(rows.map((r) => [r.name, r.n]));
}

async function runIds(): Promise<string[]> {
  return (await db.rows<{ id: string }>(`SELECT id::text FROM outlive.runs ORDER BY id`)).map((r) => r.id);
}

beforeEach(async () => {
  await db.pool.query(`TRUNCATE outlive.runs, outlive.tasks, outlive.schedule_slots CASCADE`);
});

describe('applyRetention', () => {
  it('deletes old finished tasks, keeps failed ones longer, and never touches unfinished work', async () => {
    await insertTasks('succeeded-old', 'succeeded', 8);
    await insertTasks('succeeded-young', 'succeeded', 6);
    await insertTasks('cancelled-old', 'cancelled', 8);
    await insertTasks('skipped-old', 'skipped', 8);
    await insertTasks('failed-8d', 'failed', 8);
    await insertTasks('failed-31d', 'failed', 31);
    await insertTasks('pending', 'pending', null);
    await insertTasks('running', 'running', null);
    // An unfinished row with a stale finished_at (written by hand, or by a
    // future bug) is still unfinished: its state decides.
    await insertTasks('pending-stale-finish', 'pending', 100);

    const r = await applyRetention(db.pool, { now: NOW });
    expect(r).toMatchObject({ tasks: 4, runTasks: 0, runs: 0, more: false });
    expect(await countTasks()).toEqual({
      'succeeded-young': 1,
      'failed-8d': 1,
      pending: 1,
      running: 1,
      'pending-stale-finish': 1,
    });
  });

  it('takes its ages from the options', async () => {
    await insertTasks('succeeded-2d', 'succeeded', 2);
    await insertTasks('failed-2d', 'failed', 2);
    await insertTasks('failed-4d', 'failed', 4);
    const r = await applyRetention(db.pool, { now: NOW, succeededMs: 1 * DAY, failedMs: 3 * DAY });
    expect(r.tasks).toBe(2);
    expect(await countTasks()).toEqual({ 'failed-2d': 1 });
  });

  it('deletes in batches, at most maxRows per call, and says when more is left', async () => {
    await insertTasks('bulk', 'succeeded', 10, 1_050);
    await insertTasks('pending', 'pending', null, 20);
    const reports = [];
    for (;;) {
      const r = await applyRetention(db.pool, { now: NOW, batchSize: 100, maxRows: 400 });
      reports.push(r);
      if (!r.more) break;
    }
    expect(reports.map((r) => r.tasks)).toEqual([400, 400, 250]);
    expect(reports.map((r) => r.more)).toEqual([true, true, false]);
    // Batches of 100: four in each full call; the last deletes 250 in three
    // (one short) and then finds nothing of the seven other kinds.
    expect(reports.map((r) => r.batches)).toEqual([4, 4, 3 + 7]);
    expect(await countTasks()).toEqual({ pending: 20 });
  });

  it('deletes a finished run with its tasks only when the whole run is old enough, a batch of tasks at a time', async () => {
    const oldDone = await insertRun('succeeded', 8);
    await insertTasks('old-done', 'succeeded', 8, 250, oldDone);
    const youngDone = await insertRun('succeeded', 2);
    // A task of the young run that finished long ago goes with its run, not before.
    await insertTasks('young-done', 'succeeded', 9, 2, youngDone);
    const cancelledStillRunning = await insertRun('cancelled', 8);
    await insertTasks('cancelled-finished', 'cancelled', 8, 1, cancelledStillRunning);
    await insertTasks('cancelled-running', 'running', null, 1, cancelledStillRunning);
    const running = await insertRun('running', null, 60);
    await insertTasks('run-in-progress', 'succeeded', 50, 1, running);
    await insertTasks('run-in-progress-pending', 'pending', null, 1, running);
    const failedRecent = await insertRun('failed', 10);
    await insertTasks('failed-run-10d', 'failed', 10, 1, failedRecent);
    const failedOld = await insertRun('failed', 40);
    await insertTasks('failed-run-40d', 'failed', 40, 3, failedOld);

    const r = await applyRetention(db.pool, { now: NOW, batchSize: 100 });
    // 250 tasks in three batches, then the 3 of the old failed run, then the two runs.
    expect(r).toMatchObject({ tasks: 0, runTasks: 253, runs: 2, more: false });
    expect(await runIds()).toEqual([youngDone, cancelledStillRunning, running, failedRecent]);
    expect(await countTasks()).toEqual({
      'young-done': 2,
      'cancelled-finished': 1,
      'cancelled-running': 1,
      'run-in-progress': 1,
      'run-in-progress-pending': 1,
      'failed-run-10d': 1,
    });
  });

  it('deletes old records of fired schedule slots', async () => {
    await db.pool.query(
      `INSERT INTO outlive.schedule_slots (schedule, slot) VALUES ('s', $1), ('s', $2), ('t', $1)`,
      [daysAgo(8), daysAgo(1)],
    );
    const r = await applyRetention(db.pool, { now: NOW });
    expect(r.slots).toBe(2);
    expect(await db.rows(`SELECT schedule, slot FROM outlive.schedule_slots`)).toEqual([{ schedule: 's', slot: daysAgo(1) }]);
  });

  it('lets two calls run at once, each skipping the rows the other has locked', async () => {
    await insertTasks('bulk', 'succeeded', 10, 600);
    const [a, b] = await Promise.all([
      applyRetention(db.pool, { now: NOW, batchSize: 50 }),
      applyRetention(db.pool, { now: NOW, batchSize: 50 }),
    ]);
    // A batch that comes back short because the other call took its rows ends
    // that call's run early; whatever is left goes at the next call.
    const c = await applyRetention(db.pool, { now: NOW, batchSize: 50 });
    expect(a.tasks + b.tasks + c.tasks).toBe(600);
    expect(await countTasks()).toEqual({});
  });

  it('rejects options that cannot work, naming them', async () => {
    await expect(applyRetention(db.pool, { batchSize: 0 })).rejects.toThrow(ConfigError);
    await expect(applyRetention(db.pool, { maxRows: 1.5 })).rejects.toThrow(/maxRows must be a whole number > 0/);
    await expect(applyRetention(db.pool, { failedMs: -1 })).rejects.toThrow(/failedMs must be a number > 0/);
  });
});
