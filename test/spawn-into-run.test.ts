/**
 * Spawns whose `after` names steps already in the run: the spawner itself, a
 * sibling settled in the same batch, a step not yet due, a step running in
 * another pass. Each new row must wait for exactly the dependencies that
 * have not succeeded, released once each, whatever settles when.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, explainRun, NonRetriableError, startRun, step, tick, type AnyTask } from '../src/index.js';
import { insertSpawns } from '../src/pass/run-effects.js';
import { prepareStep } from '../src/model/step.js';
import { inTransaction, toExecutor } from '../src/db/executor.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
await db.pool.query(`CREATE TABLE log (seq bigserial, step text)`);

async function clear() {
  await db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks; DELETE FROM outlive.task_deps; DELETE FROM log');
}

const logStep = (label: string) => db.pool.query('INSERT INTO log (step) VALUES ($1)', [label]);
const order = async () => (await db.rows<{ step: string }>('SELECT step FROM log ORDER BY seq')).map((r) => r.step);
const rowOf = async (runId: string, stepName: string) =>
  (await db.rows<{ state: string; waiting_on: number }>(`SELECT state::text, waiting_on FROM outlive.tasks WHERE run_id = $1 AND step = $2`, [runId, stepName]))[0];
const runOf = async (runId: string) => (await db.rows<{ state: string; unfinished: number }>(`SELECT state::text, unfinished FROM outlive.runs WHERE id = $1`, [runId]))[0];

/** A task that logs its label and succeeds; synchronous, so a batch of them settles together. */
const leaf = defineTask({ name: 'leaf', input: z.object({ label: z.string() }), retry: { maxAttempts: 1 }, run: async ({ label }) => {
  await logStep(label);
  return label;
} });

async function drain(tasks: AnyTask[], now?: Date) {
  for (let i = 0; i < 50; i++) {
    const r = await tick(db.pool, { tasks, concurrency: 10, now });
    if (r.claimed === 0) return;
  }
  throw new Error('did not drain');
}

describe('a spawn waiting for steps already in the run', () => {
  it('waits for its own spawner: released once, it runs and the run finishes', async () => {
    await clear();
    const spawner = defineTask({ name: 'spawner', input: z.object({}), run: (_i, ctx) => {
      ctx.spawn('z', step(leaf, { label: 'z' }, { after: ['spawner'] }));
    } });
    const run = await startRun(db.pool, 'self', { spawner: step(spawner, {}) });
    await drain([spawner, leaf]);
    expect(await rowOf(run.id, 'z')).toEqual({ state: 'succeeded', waiting_on: 0 });
    expect(await runOf(run.id)).toEqual({ state: 'succeeded', unfinished: 0 });
  });

  it('still waits for a step not yet due, beside its spawner', async () => {
    await clear();
    const spawner = defineTask({ name: 'spawner', input: z.object({}), run: (_i, ctx) => {
      ctx.spawn('z', step(leaf, { label: 'z' }, { after: ['slow', 'spawner'] }));
    } });
    const later = new Date(Date.now() + 3_600_000);
    const run = await startRun(db.pool, 'slow', {
      spawner: step(spawner, {}),
      slow: step(leaf, { label: 'slow' }, { runAt: later }),
    });
    await drain([spawner, leaf]);
    expect(await order()).toEqual([]);
    expect(await rowOf(run.id, 'z')).toEqual({ state: 'pending', waiting_on: 1 });
    expect((await explainRun(db.pool, run.id))!.tasks.find((t) => t.step === 'z')!.why).toBe('waiting for "slow" to succeed');
    await drain([spawner, leaf], new Date(later.getTime() + 1_000));
    expect(await order()).toEqual(['slow', 'z']);
    expect(await runOf(run.id)).toEqual({ state: 'succeeded', unfinished: 0 });
  });

  it('still waits for a step not yet due, beside a sibling settled in the same batch as the spawner', async () => {
    await clear();
    // `first` settles alone; the spawner and `sib` finish while its settle is
    // in flight, so they settle together in the next batch.
    const spawner = defineTask({ name: 'spawner', input: z.object({}), priority: 5, run: (_i, ctx) => {
      ctx.spawn('z', step(leaf, { label: 'z' }, { after: ['sib', 'slow'] }));
    } });
    const quick = defineTask({ name: 'quick', input: z.object({}), run: () => 'ok' });
    const later = new Date(Date.now() + 3_600_000);
    const run = await startRun(db.pool, 'sibling', {
      first: step(quick, {}, { priority: 9 }),
      spawner: step(spawner, {}),
      sib: step(quick, {}, { priority: 1 }),
      slow: step(leaf, { label: 'slow' }, { runAt: later }),
    });
    await drain([spawner, quick, leaf]);
    expect(await order()).toEqual([]);
    expect(await rowOf(run.id, 'z')).toEqual({ state: 'pending', waiting_on: 1 });
    await drain([spawner, quick, leaf], new Date(later.getTime() + 1_000));
    expect(await order()).toEqual(['slow', 'z']);
    expect(await runOf(run.id)).toEqual({ state: 'succeeded', unfinished: 0 });
  });

  it('the schema refuses a negative waiting_on, so a double release fails in the statement that does it', async () => {
    await clear();
    const run = await startRun(db.pool, 'check', { a: step(leaf, { label: 'a' }) });
    await expect(db.pool.query(`UPDATE outlive.tasks SET waiting_on = -1 WHERE run_id = $1`, [run.id])).rejects.toThrow(/tasks_waiting_on_check|violates check constraint/);
  });

  // The settle of a run task that spawned nothing is one statement, whose
  // snapshot may predate a spawn committed while it waited for the row lock
  // the spawn held: that statement cannot see the new edge, so the new row's
  // release must not depend on it alone.
  it('a spawn onto a step that another pass settles while the spawn holds its lock is released', async () => {
    await clear();
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    const blocker = defineTask({ name: 'blocker', input: z.object({}), run: async () => {
      await held;
      return 'done';
    } });
    const run = await startRun(db.pool, 'race', { d: step(blocker, {}), s: step(leaf, { label: 's' }) });
    const ids = Object.fromEntries((await db.rows<{ id: string; step: string }>(`SELECT id::text, step FROM outlive.tasks WHERE run_id = $1`, [run.id])).map((r) => [r.step, r.id]));
    // Pass B runs `d` and holds it until told.
    const passB = tick(db.pool, { tasks: [blocker], concurrency: 1 });
    for (let i = 0; (await rowOf(run.id, 'd'))!.state !== 'running'; i++) {
      if (i > 200) throw new Error('d never started');
      await new Promise((r) => setTimeout(r, 10));
    }
    // Transaction A: the spawn of `z` after `d`, as a settle of `s` writes it, holding `d`'s lock.
    const spawnTx = inTransaction(db.pool, async (tx) => {
      await insertSpawns(tx, run.id, ids.s!, [prepareStep('test', 'z', step(leaf, { label: 'z' }, { after: ['d'] }))], null);
      finish();
      // Wait until B's settle of `d` is blocked on the lock this transaction holds.
      for (let i = 0; ; i++) {
        const [w] = (await toExecutor(db.pool).query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%outlive.task_deps%'`,
        ));
        if (w!.n > 0) break;
        if (i > 300) throw new Error('the settle of d never waited for the lock');
        await new Promise((r) => setTimeout(r, 10));
      }
    });
    await spawnTx;
    await passB;
    await drain([blocker, leaf]);
    expect(await rowOf(run.id, 'z')).toEqual({ state: 'succeeded', waiting_on: 0 });
  });

  // The skip of a failure's downstream is one statement too: its snapshot may
  // predate a spawn onto a step it is about to skip, committed while the
  // statement waited for that step's lock. The new row then waited for a
  // skipped step forever, and its run never finished (property seed 868806230).
  it('a spawn onto a step that a failure elsewhere skips while the spawn holds its lock is skipped too, and the run finishes', async () => {
    await clear();
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    const breaks = defineTask({ name: 'breaks', input: z.object({}), retry: { maxAttempts: 1 }, run: async () => {
      await held;
      throw new NonRetriableError('broke');
    } });
    const run = await startRun(db.pool, 'skip-race', {
      f: step(breaks, {}),
      d: step(leaf, { label: 'd' }, { after: ['f'] }),
      s: step(leaf, { label: 's' }),
    });
    const ids = Object.fromEntries((await db.rows<{ id: string; step: string }>(`SELECT id::text, step FROM outlive.tasks WHERE run_id = $1`, [run.id])).map((r) => [r.step, r.id]));
    const passA = tick(db.pool, { tasks: [breaks], concurrency: 1 });
    for (let i = 0; (await rowOf(run.id, 'f'))!.state !== 'running'; i++) {
      if (i > 200) throw new Error('f never started');
      await new Promise((r) => setTimeout(r, 10));
    }
    await inTransaction(db.pool, async (tx) => {
      // As a settle of s spawning z after d writes it, holding d's lock.
      const unfinished = await insertSpawns(tx, run.id, ids.s!, [prepareStep('test', 'z', step(leaf, { label: 'z' }, { after: ['d'] }))], null);
      await tx.query(`UPDATE outlive.runs SET unfinished = unfinished + $2 WHERE id = $1`, [run.id, unfinished]);
      finish();
      for (let i = 0; ; i++) {
        const [w] = await toExecutor(db.pool).query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%RECURSIVE down%'`,
        );
        if (w!.n > 0) break;
        if (i > 300) throw new Error('the skip of d never waited for the lock');
        await new Promise((r) => setTimeout(r, 10));
      }
    });
    await passA;
    await drain([breaks, leaf]);
    expect(await rowOf(run.id, 'z')).toMatchObject({ state: 'skipped' });
    expect(await runOf(run.id)).toEqual({ state: 'failed', unfinished: 0 });
  });
});

describe('a spawn naming a step the run already has', () => {
  const slowSpawner = defineTask({
    name: 'slow-spawner',
    input: z.object({ name: z.string(), waitMs: z.number() }),
    retry: { maxAttempts: 1 },
    run: async ({ name, waitMs }, ctx) => {
      await new Promise((r) => setTimeout(r, waitMs));
      ctx.spawn(name, step(leaf, { label: name }));
      return null;
    },
  });
  const failures = async (runId: string) =>
    db.rows<{ step: string; last_error: string }>(`SELECT step, last_error FROM outlive.tasks WHERE run_id = $1 AND state = 'failed' ORDER BY id`, [runId]);

  it('fails the spawner with the step named, never a raw database error: its own name, a sibling\'s in one pass, two passes at once', async () => {
    await clear();
    const own = await startRun(db.pool, 'own name', { a: step(slowSpawner, { name: 'a', waitMs: 0 }) });
    await drain([slowSpawner, leaf]);
    expect(await failures(own.id)).toEqual([{ step: 'a', last_error: expect.stringMatching(/: step "a" already exists in the run$/) }]);

    const siblings = await startRun(db.pool, 'siblings', { a: step(slowSpawner, { name: 'x', waitMs: 0 }), b: step(slowSpawner, { name: 'x', waitMs: 0 }) });
    await drain([slowSpawner, leaf]);
    expect(await failures(siblings.id)).toEqual([{ step: expect.any(String), last_error: expect.stringMatching(/: step "x" already exists in the run$/) }]);

    // Two passes each run one sibling, and both settle their spawn at once: the unique index meets the second.
    const racing = await startRun(db.pool, 'racing', { a: step(slowSpawner, { name: 'y', waitMs: 200 }), b: step(slowSpawner, { name: 'y', waitMs: 200 }) });
    const pass = () => tick(db.pool, { tasks: [slowSpawner, leaf], concurrency: 1, maxTasks: 1 });
    await Promise.all([pass(), pass()]);
    await drain([slowSpawner, leaf]);
    const raced = await failures(racing.id);
    expect(raced).toEqual([{ step: expect.any(String), last_error: expect.stringMatching(/: step "y" already exists in the run$/) }]);
    expect(raced[0]!.last_error).not.toMatch(/duplicate key|23505|constraint/);
  });
});
