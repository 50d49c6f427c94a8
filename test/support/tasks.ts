/**
 * Small task factories for tests, and a side-effect table whose unique
 * constraint proves a handler's effect was applied once.
 */
import type pg from 'pg';
import { z } from 'zod';
import { defineTask, step, type AnyTask, type Step } from '../../src/index.js';

/** Creates the `effects` table: one row per (task id, label), unique. */
export async function createEffects(pool: pg.Pool): Promise<void> {
  await pool.query(`CREATE TABLE IF NOT EXISTS effects (task_id bigint NOT NULL, label text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (task_id, label))`);
}

/** A task that records one effect per task id; a second run of the same task violates the unique constraint. */
export function recordingTask(pool: pg.Pool, name = 'record') {
  return defineTask({
    name,
    input: z.object({ n: z.number().int() }),
    async run({ n }, ctx) {
      await pool.query('INSERT INTO effects (task_id, label) VALUES ($1, $2)', [ctx.taskId, String(n)]);
      return { n };
    },
  });
}

/** Reads one task row by id. */
export async function taskRow(pool: pg.Pool, id: string) {
  const { rows } = await pool.query(`SELECT *, id::text AS id FROM outlive.tasks WHERE id = $1`, [id]);
  return rows[0];
}

/** Counts tasks by state. */
export async function countByState(pool: pg.Pool): Promise<Record<string, number>> {
  const { rows } = await pool.query(`SELECT state::text, count(*)::int AS n FROM outlive.tasks GROUP BY state`);
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

/** A fan-out graph: `root`, `leaves` steps after it (l1, l2, ...), and `join` after all of them; `input(i)` for step i (0 for root, -1 for join). */
export function fanOut(task: AnyTask, leaves: number, input: (i: number) => unknown): Record<string, Step> {
  const steps: Record<string, Step> = { root: step(task, input(0)) };
  const names: string[] = [];
  for (let i = 1; i <= leaves; i++) {
    names.push(`l${i}`);
    steps[`l${i}`] = step(task, input(i), { after: ['root'] });
  }
  steps.join = step(task, input(-1), { after: names });
  return steps;
}
