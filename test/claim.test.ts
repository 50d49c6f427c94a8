import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, enqueueMany, tick } from '../src/index.js';
import { claim } from '../src/pass/claim.js';
import { toExecutor, type Executor } from '../src/db/executor.js';
import { withPreparedStatements } from '../src/db/statements.js';
import { closePool, freshDb } from './support/db.js';
import { countByState, createEffects, recordingTask } from './support/tasks.js';

const db = await freshDb();
await createEffects(db.pool);

describe('claim', () => {
  // A worker idles on an empty queue, claiming now and then, and then a burst
  // arrives. A claim prepared as a named statement had, by then, switched to
  // the generic plan Postgres made for the empty table: a scan of the whole
  // table joined to the claimed rows by comparing every pair (~1 s a claim
  // of 500 among 20,000). The claim is prepared again since migration 0009,
  // as a call of outlive.claim, whose generic plan must be the index plan
  // even when made on an empty table. Sent unnamed (through a transaction
  // pooler that keeps no prepared statements), the call is parsed each time
  // but the function's own plan is still cached per session, and generic.
  it.each(['named', 'unnamed'])('claims a burst that follows an idle spell by index, not by scanning the table once per row (%s)', async (mode) => {
    const fresh = await freshDb();
    // One session throughout: the plan cached in it is what this checks.
    const client = await fresh.direct.connect();
    const named = toExecutor(client);
    const exec: Executor = mode === 'named' ? named : { query: (text, params) => named.query(text, params) };
    const request = { owner: 'pass', maxTimeoutMs: 60_000, queues: null, names: ['idle', 'burst'], leaseGraceMs: 1_000, leaseMs: 30_000, now: null };
    const seqRead = async () => {
      // Statistics reach the view when the claiming backend next goes idle.
      await client.query('SELECT pg_stat_force_next_flush()');
      await client.query('SELECT 1');
      const [row] = await fresh.rows<{ n: number }>(`SELECT seq_tup_read::float8 AS n FROM pg_stat_user_tables WHERE relid = 'outlive.tasks'::regclass`);
      return row!.n;
    };
    try {
      for (let i = 0; i < 12; i++) {
        expect(await claim(exec, { ...request, limit: 1_000 })).toEqual([]);
        await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('idle', '{}', 3, 1000)`);
        expect(await claim(exec, { ...request, limit: 1_000 })).toHaveLength(1);
      }
      await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'burst', '{}', 3, 1000 FROM generate_series(1, 20000)`);
      const before = await seqRead();
      expect(await claim(exec, { ...request, limit: 500 })).toHaveLength(500);
      // Not one row read by a scan of the table: the cached plan read all
      // 20,000 and compared each with every claimed row.
      expect((await seqRead()) - before).toBe(0);
    } finally {
      client.release();
    }
  });

  it('10 passes at once over 2,000 tasks run every task exactly once', async () => {
    const record = recordingTask(db.pool);
    await enqueueMany(db.pool, record, Array.from({ length: 2_000 }, (_, n) => ({ n })));
    // Each pass is its own "process": its own pool, its own lease owner.
    const pools = Array.from({ length: 10 }, () => db.newPool({ max: 3 }));
    const reports = await Promise.all(pools.map((pool) => tick(pool, { tasks: [record], concurrency: 8 })));
    await Promise.all(pools.map(closePool));

    expect(reports.reduce((s, r) => s + r.claimed, 0)).toBe(2_000);
    expect(reports.reduce((s, r) => s + r.succeeded, 0)).toBe(2_000);
    expect(reports.filter((r) => r.claimed > 0).length).toBeGreaterThan(1);
    // The unique constraint on effects would have failed a second run; check the count too.
    const [{ n }] = (await db.rows<{ n: number }>('SELECT count(*)::int AS n FROM effects')) as [{ n: number }];
    expect(n).toBe(2_000);
    expect(await countByState(db.pool)).toEqual({ succeeded: 2_000 });
    const [{ max }] = (await db.rows<{ max: number }>('SELECT max(attempts) AS max FROM outlive.tasks')) as [{ max: number }];
    expect(max).toBe(1);
  });

  it('concurrent claims take disjoint rows and none waits on another', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    const noop = defineTask({ name: 'noop', input: z.object({ i: z.number() }), run: () => null });
    await enqueueMany(db.pool, noop, Array.from({ length: 100 }, (_, i) => ({ i })));
    // Hold 10 rows locked in an open claim transaction; other claims skip them instead of waiting.
    const holder = await db.pool.connect();
    await holder.query('BEGIN');
    const held = await toExecutor(holder).query<{ id: string }>(
      `SELECT id::text FROM outlive.tasks ORDER BY id LIMIT 10 FOR UPDATE`,
    );
    const claims = await Promise.all(
      Array.from({ length: 9 }, (_, k) =>
        claim(toExecutor(withPreparedStatements(db.pool)), { owner: `c${k}`, limit: 10, maxTimeoutMs: 60_000, queues: null, names: ['noop'], leaseGraceMs: 1000, leaseMs: 30_000, now: null }),
      ),
    );
    await holder.query('ROLLBACK');
    holder.release();
    const ids = claims.flat().map((r) => r.id);
    expect(ids).toHaveLength(90);
    expect(new Set(ids).size).toBe(90);
    expect(ids.some((id) => held.some((h) => h.id === id))).toBe(false);
  });

  it('claims higher priority first, then earlier run_at, and only ready rows', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    const order: string[] = [];
    const t = defineTask({ name: 'ordered', input: z.object({ label: z.string() }), run: ({ label }) => void order.push(label) });
    const base = new Date('2026-01-01T00:00:00Z');
    await enqueue(db.pool, t, { label: 'low-early' }, { priority: 0, runAt: new Date(base.getTime() - 2000) });
    await enqueue(db.pool, t, { label: 'high' }, { priority: 5, runAt: base });
    await enqueue(db.pool, t, { label: 'low-late' }, { priority: 0, runAt: new Date(base.getTime() - 1000) });
    await enqueue(db.pool, t, { label: 'future' }, { priority: 9, runAt: new Date(base.getTime() + 60_000) });
    await tick(db.pool, { tasks: [t], concurrency: 1, now: base });
    expect(order).toEqual(['high', 'low-early', 'low-late']);
  });

  it('claims only the queues it is given', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    const t = defineTask({ name: 'queued', input: z.object({}), run: () => null });
    await enqueue(db.pool, t, {}, { queue: 'a' });
    await enqueue(db.pool, t, {}, { queue: 'b' });
    const report = await tick(db.pool, { tasks: [t], queues: ['b'] });
    expect(report.claimed).toBe(1);
    const rows = await db.rows<{ queue: string; state: string }>(`SELECT queue, state::text FROM outlive.tasks ORDER BY queue`);
    expect(rows).toEqual([
      { queue: 'a', state: 'pending' },
      { queue: 'b', state: 'succeeded' },
    ]);
  });

  it('reads the partial claim index however many finished rows pile up', async () => {
    await db.pool.query('DELETE FROM outlive.tasks');
    await db.pool.query(`
      INSERT INTO outlive.tasks (name, state, input, max_attempts, timeout_ms, finished_at)
      SELECT 'done', 'succeeded', '{}', 1, 1000, now() FROM generate_series(1, 20000)`);
    await db.pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'todo', '{}', 1, 1000 FROM generate_series(1, 5)`);
    await db.pool.query('ANALYZE outlive.tasks');
    const { CLAIM_SQL } = await import('../src/pass/claim.js');
    const client = await db.direct.connect();
    try {
      await client.query('BEGIN');
      const plan = (await client.query(`EXPLAIN ${CLAIM_SQL}`, [null, 60_000, null, 10, 'explain', 1000, 30_000, ['todo']])).rows
        .map((r) => r['QUERY PLAN'])
        .join('\n');
      await client.query('ROLLBACK');
      expect(plan).toMatch(/Index Scan using tasks_claim_idx/);
      expect(plan).not.toMatch(/Seq Scan on tasks/);
    } finally {
      client.release();
    }
  });

  it('runs CLAIM_SQL, character for character, inside outlive.claim', async () => {
    const { CLAIM_SQL, PLAIN_CLAIM_FUNCTION: CLAIM_FUNCTION } = await import('../src/pass/claim.js');
    const [fn] = await db.rows<{ src: string; config: string[] }>(
      `SELECT prosrc AS src, proconfig AS config FROM pg_proc WHERE oid = to_regprocedure($1)`,
      [CLAIM_FUNCTION],
    );
    expect(fn!.src).toContain(CLAIM_SQL.trimEnd());
    expect(fn!.config).toEqual(['plan_cache_mode=force_generic_plan', 'enable_seqscan=off', 'enable_bitmapscan=off', 'search_path=pg_catalog, pg_temp']);
  });

  // The plan outlive.claim makes, generic and with sequential scans priced
  // out, planned here the same way on tables of every size the planner might
  // see first: empty and never analyzed, a few rows, many.
  it('plans the claim by index on an empty table, a small one and a big one', async () => {
    const fresh = await freshDb();
    const { CLAIM_SQL } = await import('../src/pass/claim.js');
    const client = await fresh.pool.connect();
    const plans: string[] = [];
    try {
      for (const rows of [0, 3, 20_000]) {
        if (rows > 0) await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'n', '{}', 3, 1000 FROM generate_series(1, $1::int)`, [rows]);
        if (rows === 3) await client.query('ANALYZE outlive.tasks');
        await client.query('BEGIN');
        await client.query('SET LOCAL plan_cache_mode = force_generic_plan');
        await client.query('SET LOCAL enable_seqscan = off');
        await client.query('SET LOCAL enable_bitmapscan = off');
        await client.query(`PREPARE claim_plan AS ${CLAIM_SQL}`);
        const plan = (await client.query(`EXPLAIN EXECUTE claim_plan(NULL, 60000, NULL, 500, 'explain', 1000, 30000, '{n}')`)).rows
          .map((r) => r['QUERY PLAN'])
          .join('\n');
        await client.query('DEALLOCATE claim_plan');
        await client.query('ROLLBACK');
        plans.push(`${rows} rows:\n${plan}`);
      }
    } finally {
      client.release();
    }
    for (const plan of plans) {
      expect(plan).toMatch(/Index Scan using tasks_claim_idx/);
      expect(plan).toMatch(/Index Scan using tasks_pkey on tasks t/);
      expect(plan).not.toMatch(/Seq Scan/);
      expect(plan).not.toMatch(/Sort/);
    }
  });
});
