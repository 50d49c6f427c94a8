/**
 * Values that pass the schema and JSON.stringify but that PostgreSQL cannot
 * store: jsonb refuses \u0000 and unpaired surrogates, text refuses 0x00.
 * Found while cataloguing bad input for issue 8; these tests state the
 * behaviour the engine should have and fail until it does.
 *
 * - enqueue: the value reaches the database and comes back as its raw
 *   DatabaseError (nothing is written, but inside a caller's transaction it
 *   aborts the whole transaction), instead of an InvalidEnqueueError before
 *   any write, as bad input gets elsewhere.
 * - a handler's output: the settle statement fails, the pass throws a
 *   PassError, and the task is left running under its lease until recovery
 *   re-runs it (each attempt ending "lease expired"). Tasks outside runs
 *   settle in one statement per batch with no per-outcome fallback
 *   (src/pass/settle.ts, `settle`), so every task settled in the same batch is
 *   left running and re-executed with it.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, enqueueMany, InvalidEnqueueError, tick } from '../src/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

async function snapshot() {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n, md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) AS sum FROM outlive.tasks x`);
  return rows[0];
}

describe('input and output the database cannot store (NUL characters, lone surrogates)', () => {
  // These pass the schema and JSON.stringify but not Postgres: jsonb refuses
  // \u0000 and unpaired surrogates, text refuses 0x00. Today they reach the
  // database and come back as its raw error (see the report of issue 8).
  const text = defineTask({ name: 'bad.text', input: z.object({ s: z.string() }), queue: 'nul', run: async () => null });
  it.each([
    ['a NUL in an input string', () => enqueue(db.pool, text, { s: 'a\u0000b' })],
    ['a lone surrogate in an input string', () => enqueue(db.pool, text, { s: '\ud800' })],
    ['a NUL in a key', () => enqueue(db.pool, text, { s: 'a' }, { key: 'k\u0000' })],
  ] as const)('%s is refused before anything is written, as an InvalidEnqueueError', async (_name, act) => {
    const before = await snapshot();
    const err = await act().catch((e: unknown) => e);
    expect(await snapshot()).toEqual(before);
    expect(err).toBeInstanceOf(InvalidEnqueueError);
  });

  it('a handler output with a NUL fails that task alone; the tasks settled with it still succeed', async () => {
    const out = defineTask({
      name: 'bad.output',
      input: z.object({ nul: z.boolean() }),
      queue: 'nul-output',
      retry: { maxAttempts: 1 },
      timeoutMs: 2_000,
      run: async ({ nul }) => ({ s: nul ? 'a\u0000b' : 'fine' }),
    });
    const [bad, good] = await enqueueMany(db.pool, out, [{ nul: true }, { nul: false }]);
    const report = await tick(db.pool, { tasks: [out], queues: ['nul-output'], concurrency: 2, budgetMs: 10_000 }).catch((e: unknown) => e);
    const states = await db.rows<{ id: string; state: string; last_error: string | null }>(
      `SELECT id::text, state::text, last_error FROM outlive.tasks WHERE id = ANY($1::bigint[]) ORDER BY id`,
      [[bad!.id, good!.id]],
    );
    expect({ report: report instanceof Error ? report.message : 'no error', states }).toEqual({
      report: 'no error',
      states: [
        { id: bad!.id, state: 'failed', last_error: expect.stringMatching(/could not record the outcome|output/) },
        { id: good!.id, state: 'succeeded', last_error: null },
      ],
    });
  });
});
