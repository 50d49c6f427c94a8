/**
 * A pass's named statements on a path that does not keep them. A transaction
 * pooler hands each transaction whichever server connection is free, so a
 * statement the driver prepared is missing on the next one (26000), or there
 * already under the same name (42P05). Both are made here on one connection,
 * deterministically, with no pooler: DEALLOCATE ALL behind the driver's back,
 * and a PREPARE under the name the driver is about to use.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, startRun, step, tick } from '../src/index.js';
import { closePool, freshDb, openPool } from './support/db.js';

const db = await freshDb();
let pools = 0;

/**
 * A pool of one direct connection (this file makes the pooler's errors on
 * its own), at a URL no other test uses: what a pool learns is kept per URL.
 */
function onePool(): pg.Pool {
  const u = new URL(db.directUrl);
  u.searchParams.set('application_name', `prepared-${pools++}`);
  const pool = openPool({ connectionString: u.toString(), max: 1 });
  pool.on('error', () => undefined);
  return pool;
}

const double = defineTask({ name: 'ps-double', input: z.object({ n: z.number() }), run: ({ n }) => n * 2 });
const flaky = defineTask({
  name: 'ps-flaky',
  input: z.object({ fail: z.boolean() }),
  retry: { maxAttempts: 1 },
  run: ({ fail }) => {
    if (fail) throw new Error('no');
    return 'ok';
  },
});

async function states(ids: string[]): Promise<string[]> {
  const rows = await db.rows<{ state: string }>(`SELECT state::text FROM outlive.tasks WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids]);
  return rows.map((r) => r.state);
}

describe('named statements the connection lost', () => {
  it('a pass whose prepared claim and settle were deallocated sends them again unnamed, and every task settles once', async () => {
    const pool = onePool();
    await enqueue(pool, double, { n: 1 });
    expect(await tick(pool, { tasks: [double] })).toMatchObject({ claimed: 1, succeeded: 1 });
    // The driver still believes outlive_claim_tasks and outlive_succeed are prepared.
    await pool.query('DEALLOCATE ALL');
    const ids = [];
    for (let n = 0; n < 5; n++) ids.push((await enqueue(pool, double, { n })).id);
    const report = await tick(pool, { tasks: [double] });
    expect(report).toMatchObject({ claimed: 5, succeeded: 5, failed: 0, lostLeases: 0 });
    expect(await states(ids)).toEqual(Array(5).fill('succeeded'));
    const [sum] = await db.rows<{ attempts: string }>(`SELECT sum(attempts)::text AS attempts FROM outlive.tasks WHERE id = ANY($1::bigint[])`, [ids]);
    expect(sum!.attempts).toBe('5');
    await closePool(pool);
  });

  it('a statement already prepared under the name the pass uses does not fail the pass', async () => {
    const pool = onePool();
    await pool.query(`PREPARE outlive_claim_tasks AS SELECT 1`);
    const { id } = await enqueue(pool, double, { n: 2 });
    expect(await tick(pool, { tasks: [double] })).toMatchObject({ claimed: 1, succeeded: 1 });
    expect(await states([id])).toEqual(['succeeded']);
    await closePool(pool);
  });

  it('a settle inside a transaction (a run step that failed) runs its transaction again unnamed; no task is failed for it', async () => {
    const pool = onePool();
    // The claim is prepared as usual; the settle's name is taken, as on a
    // server connection another client prepared it on.
    await pool.query(`PREPARE outlive_settle_v5 AS SELECT 1`);
    const run = await startRun(pool, 'lost', { a: step(flaky, { fail: true }), b: step(flaky, { fail: false }, { after: ['a'] }) });
    const report = await tick(pool, { tasks: [flaky] });
    expect(report).toMatchObject({ claimed: 1, failed: 1, lostLeases: 0 });
    const rows = await db.rows<{ step: string; state: string; last_error: string | null }>(
      `SELECT step, state::text, last_error FROM outlive.tasks WHERE run_id = $1 ORDER BY step`,
      [run.id],
    );
    expect(rows.map((r) => [r.step, r.state])).toEqual([
      ['a', 'failed'],
      ['b', 'skipped'],
    ]);
    // The handler's own error, not "could not record the outcome".
    expect(rows[0]!.last_error).toBe('no');
    await closePool(pool);
  });

  it('preparedStatements: true fails the pass with the fix named, and keeps the task for recovery rather than failing it', async () => {
    const pool = onePool();
    await enqueue(pool, double, { n: 3 });
    await tick(pool, { tasks: [double], preparedStatements: true });
    await pool.query('DEALLOCATE ALL');
    const { id } = await enqueue(pool, double, { n: 4 });
    await expect(tick(pool, { tasks: [double], preparedStatements: true })).rejects.toThrow(
      /does not exist: the database's connection path does not keep prepared statements .* set it to false/,
    );
    expect(await states([id])).toEqual(['pending']);
    await closePool(pool);
  });

  it('preparedStatements: false sends no named statement at all', async () => {
    const pool = onePool();
    const { id } = await enqueue(pool, double, { n: 5 });
    expect(await tick(pool, { tasks: [double], preparedStatements: false })).toMatchObject({ failed: 0, lostLeases: 0 });
    const [prepared] = (await pool.query<{ n: string }>(`SELECT count(*)::text AS n FROM pg_prepared_statements`)).rows;
    expect(prepared!.n).toBe('0');
    expect(await states([id])).toEqual(['succeeded']);
    await expect(tick(pool, { tasks: [double], preparedStatements: 'yes' as never })).rejects.toThrow(/preparedStatements must be true, false or 'auto'/);
    await closePool(pool);
  });
});
