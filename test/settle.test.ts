import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, defineTask, enqueue, NonRetriableError, PassError, recover, RetryAfterError, startRun, step, tick } from '../src/index.js';
import type { Outcome } from '../src/pass/execute.js';
import { claim } from '../src/pass/claim.js';
import { toExecutor, type PoolLike } from '../src/db/executor.js';
import { withPreparedStatements } from '../src/db/statements.js';
import { DROP_SQL, settle, SETTLE_RUN_TASKS_SQL, SETTLE_SQL, SUCCEED_RUN_TASKS_SQL, SUCCEED_SQL } from '../src/pass/settle.js';
import { LOST_SQL } from '../src/pass/lease-watch.js';
import { freshDb } from './support/db.js';
import { fanOut, taskRow } from './support/tasks.js';

const db = await freshDb();
const T0 = new Date('2026-03-01T12:00:00Z');
const at = (ms: number) => new Date(T0.getTime() + ms);

async function clear() {
  await db.pool.query('DELETE FROM outlive.tasks');
}

/** Rows of outlive.tasks that an EXPLAIN ANALYZE plan's scans read: returned, or read and filtered out. */
function tasksRowsRead(node: Record<string, unknown>): number {
  let rows = 0;
  if (node['Relation Name'] === 'tasks' && node['Node Type'] !== 'ModifyTable') {
    rows += (Number(node['Actual Rows'] ?? 0) + Number(node['Rows Removed by Filter'] ?? 0)) * Number(node['Actual Loops'] ?? 1);
  }
  for (const child of (node['Plans'] as Record<string, unknown>[] | undefined) ?? []) rows += tasksRowsRead(child);
  return rows;
}

/** SQL literals of the parameters with which the settle statements (and the lease check) settle `tasks` as successes under `owner`. */
function settleArgs(tasks: readonly { id: string }[], owner: string) {
  const list = (f: (id: string) => string) => `'{${tasks.map((t) => f(t.id)).join(',')}}'`;
  const ids = list((id) => id);
  const nulls = list(() => 'null');
  const attempts = list(() => '1');
  return {
    succeed: `NULL, ${ids}, ${nulls}, '${owner}', ${attempts}`,
    settle: `NULL, ${ids}, ${list(() => 'succeeded')}, ${nulls}, ${nulls}, ${list(() => '0')}, ${nulls}, '${owner}', ${attempts}`,
    drop: `${ids}, '${owner}', ${attempts}`,
    lost: `${ids}, '${owner}'`,
  };
}

describe('settle', () => {
  it('retries with exponential backoff from the row, then fails for good keeping every error', async () => {
    await clear();
    let calls = 0;
    const flaky = defineTask({
      name: 'always-fails',
      input: z.object({}),
      retry: { maxAttempts: 3, backoff: { baseMs: 10_000, factor: 3, jitter: 'none' } },
      run: () => {
        calls++;
        throw new Error(`boom ${calls}`);
      },
    });
    const { id } = await enqueue(db.pool, flaky, {}, { runAt: T0 });

    let report = await tick(db.pool, { tasks: [flaky], now: T0 });
    expect(report).toMatchObject({ claimed: 1, retried: 1, failed: 0 });
    let row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'pending', attempts: 1, last_error: 'boom 1', lease_owner: null });
    expect(new Date(row.run_at).getTime()).toBe(at(10_000).getTime());

    // Not due yet: a pass at T0 + 9 s finds nothing.
    expect((await tick(db.pool, { tasks: [flaky], now: at(9_000) })).claimed).toBe(0);

    report = await tick(db.pool, { tasks: [flaky], now: at(10_000) });
    expect(report).toMatchObject({ claimed: 1, retried: 1 });
    row = await taskRow(db.pool, id);
    expect(new Date(row.run_at).getTime()).toBe(at(10_000 + 30_000).getTime());

    report = await tick(db.pool, { tasks: [flaky], now: at(40_000) });
    expect(report).toMatchObject({ claimed: 1, retried: 0, failed: 1 });
    row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'failed', attempts: 3, last_error: 'boom 3' });
    expect(new Date(row.finished_at).getTime()).toBe(at(40_000).getTime());
    expect(row.errors.map((e: { attempt: number; message: string }) => [e.attempt, e.message])).toEqual([
      [1, 'boom 1'],
      [2, 'boom 2'],
      [3, 'boom 3'],
    ]);
    expect(row.errors[0].stack).toMatch(/boom 1/);
    // Failed for good: no further pass touches it.
    expect((await tick(db.pool, { tasks: [flaky], now: at(10_000_000) })).claimed).toBe(0);
    expect(calls).toBe(3);
  });

  it('fails at once on NonRetriableError', async () => {
    await clear();
    const t = defineTask({
      name: 'not-found',
      input: z.object({}),
      run: () => {
        throw new NonRetriableError('page is gone (404)');
      },
    });
    const { id } = await enqueue(db.pool, t, {});
    const report = await tick(db.pool, { tasks: [t] });
    expect(report).toMatchObject({ failed: 1, retried: 0 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'failed', attempts: 1, max_attempts: 5, last_error: 'page is gone (404)' });
  });

  it('retries after the delay a RetryAfterError asks for', async () => {
    await clear();
    let n = 0;
    const t = defineTask({
      name: 'rate-limited',
      input: z.object({}),
      run: () => {
        if (n++ === 0) throw new RetryAfterError('429', 120_000);
        if (n === 2) throw new RetryAfterError('429 until', at(500_000));
        return 'ok';
      },
    });
    const { id } = await enqueue(db.pool, t, {}, { runAt: T0 });
    await tick(db.pool, { tasks: [t], now: T0 });
    expect(new Date((await taskRow(db.pool, id)).run_at).getTime()).toBe(at(120_000).getTime());
    await tick(db.pool, { tasks: [t], now: at(120_000) });
    expect(new Date((await taskRow(db.pool, id)).run_at).getTime()).toBe(at(500_000).getTime());
    await tick(db.pool, { tasks: [t], now: at(500_000) });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', output: 'ok', attempts: 3 });
  });

  it('aborts a handler at its timeout and retries it; the pass does not hang', async () => {
    await clear();
    let sawAbort = false;
    const hangs = defineTask({
      name: 'hangs',
      input: z.object({}),
      timeoutMs: 100,
      run: (_input, ctx) =>
        new Promise((resolve) => {
          ctx.signal.addEventListener('abort', () => (sawAbort = true));
          // Never resolves on its own; ignores the signal beyond noting it.
          void resolve;
        }),
    });
    const { id } = await enqueue(db.pool, hangs, {});
    const report = await tick(db.pool, { tasks: [hangs] });
    expect(report).toMatchObject({ claimed: 1, retried: 1 });
    expect(sawAbort).toBe(true);
    const row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'pending', last_error: 'timed out after 100 ms' });
    expect(row.errors[0].name).toBe('TaskTimeoutError');
  });

  it('survives handlers that throw non-Errors, return undefined or return non-JSON', async () => {
    await clear();
    const weird = defineTask({
      name: 'weird',
      input: z.object({ mode: z.enum(['string', 'object', 'undefined', 'bigint', 'huge', 'sync']) }),
      retry: { maxAttempts: 1 },
      run: ({ mode }) => {
        if (mode === 'string') return Promise.reject('plain string');
        if (mode === 'object') return Promise.reject({ code: 7 });
        if (mode === 'sync') throw null;
        if (mode === 'bigint') return { n: 1n };
        if (mode === 'huge') return 'x'.repeat(1_100_000);
        return undefined;
      },
    });
    const modes = ['string', 'object', 'undefined', 'bigint', 'huge', 'sync'] as const;
    const ids = await Promise.all(modes.map((mode) => enqueue(db.pool, weird, { mode }).then((t) => t.id)));
    const report = await tick(db.pool, { tasks: [weird] });
    expect(report).toMatchObject({ claimed: 6, succeeded: 1, failed: 5 });
    const rows = await Promise.all(ids.map((id) => taskRow(db.pool, id)));
    expect(rows.map((r) => [r.state, r.last_error])).toEqual([
      ['failed', 'plain string'],
      ['failed', 'non-Error thrown: {"code":7}'],
      ['succeeded', null],
      ['failed', expect.stringMatching(/output does not serialise to JSON/)],
      ['failed', expect.stringMatching(/output is at least 1100002 bytes of JSON, over the limit/)],
      ['failed', 'non-Error thrown: null'],
    ]);
    expect(await db.rows(`SELECT 1 FROM outlive.tasks WHERE state = 'running'`)).toHaveLength(0);
  });

  it('leaves a row whose task name the pass does not know to a pass that does, without crashing the pass', async () => {
    await clear();
    const known = defineTask({ name: 'known', input: z.object({}), run: () => 1 });
    const ghost = defineTask({ name: 'ghost-task', input: z.object({}), run: () => 1 });
    const ghostRow = await enqueue(db.pool, ghost, {});
    const knownRow = await enqueue(db.pool, known, {});
    const report = await tick(db.pool, { tasks: [known] });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1, failed: 0 });
    expect(await taskRow(db.pool, ghostRow.id)).toMatchObject({ state: 'pending', attempts: 0, last_error: null });
    expect((await taskRow(db.pool, knownRow.id)).state).toBe('succeeded');
    expect(await tick(db.pool, { tasks: [ghost] })).toMatchObject({ claimed: 1, succeeded: 1 });
  });

  it('fails a row whose stored input no longer matches the schema', async () => {
    await clear();
    const v1 = defineTask({ name: 'evolving', input: z.object({ a: z.string() }), run: () => 1 });
    const v2 = defineTask({ name: 'evolving', input: z.object({ b: z.number() }), run: () => 1 });
    const { id } = await enqueue(db.pool, v1, { a: 'x' });
    await tick(db.pool, { tasks: [v2] });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'failed' });
    expect((await taskRow(db.pool, id)).last_error).toMatch(/stored input does not match the schema of "evolving": b:/);
  });
});

describe('a row its own pass lost and claimed again', () => {
  // A pass's lease expired (a GC pause, a frozen VM, the chaos suite's
  // backdated lease), recovery handed its row back, and the same pass
  // claimed it again while the first attempt's handler still ran: the
  // owner matches, so only the attempt tells the late result from the
  // current one. Seen in the chaos suite: a task succeeded with attempts 3
  // and the output of attempt 2.
  const late = (kind: string, id: string, attempt: number): Outcome => {
    const base = { id, runId: null, attempt };
    if (kind === 'succeeded') return { ...base, state: 'succeeded', output: '"late"' };
    if (kind === 'dropped') return { ...base, state: 'succeeded', output: null, drop: true };
    if (kind === 'retried') return { ...base, state: 'pending', retryAt: null, delayMs: 0, error: { attempt, at: new Date().toISOString(), name: 'Error', message: 'late' } };
    if (kind === 'released') return { ...base, state: 'released' };
    return { ...base, state: 'failed', error: { attempt, at: new Date().toISOString(), name: 'Error', message: 'late' } };
  };

  it.each(['succeeded', 'dropped', 'retried', 'failed', 'released'])('settles only the attempt it is for: a late %s outcome of the lost attempt matches nothing', async (kind) => {
    await clear();
    const again = defineTask({ name: 'again', input: z.object({}), run: () => null });
    const { id } = await enqueue(db.pool, again, {});
    const pass = withPreparedStatements(db.pool);
    const req = { owner: 'same', limit: 1, maxTimeoutMs: 60_000, queues: null, names: ['again'], leaseGraceMs: 100, leaseMs: 200, now: null };
    const [first] = await claim(toExecutor(pass), req);
    await db.pool.query(`UPDATE outlive.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, [id]);
    expect((await recover(db.pool)).rows).toHaveLength(1);
    await db.pool.query(`UPDATE outlive.tasks SET run_at = now() WHERE id = $1`, [id]);
    const [second] = await claim(toExecutor(pass), req);
    expect([first!.attempts, second!.attempts]).toEqual([1, 2]);
    expect(await settle(pass, 'same', [late(kind, id, first!.attempts)], null)).toEqual([]);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'running', attempts: 2, lease_owner: 'same' });
    expect(await settle(pass, 'same', [{ id, runId: null, attempt: 2, state: 'succeeded', output: '"current"' }], null)).toHaveLength(1);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', attempts: 2, output: 'current' });
  });

  it('of a run: the late outcome of a step’s lost attempt matches nothing, in the one-statement settle and in the transaction', async () => {
    await clear();
    const again = defineTask({ name: 'again-run', input: z.object({}), run: () => null });
    const pass = withPreparedStatements(db.pool);
    const req = { owner: 'same', limit: 1, maxTimeoutMs: 60_000, queues: null, names: ['again-run'], leaseGraceMs: 100, leaseMs: 200, now: null };
    for (const kind of ['succeeded', 'failed']) {
      const run = await startRun(db.pool, `again ${kind}`, { a: step(again, {}), b: step(again, {}, { after: ['a'] }) });
      const id = run.tasks.a!;
      const [first] = await claim(toExecutor(pass), req);
      await db.pool.query(`UPDATE outlive.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, [id]);
      await recover(db.pool);
      await db.pool.query(`UPDATE outlive.tasks SET run_at = now() WHERE id = $1`, [id]);
      await claim(toExecutor(pass), req);
      expect(await settle(pass, 'same', [{ ...late(kind, id, first!.attempts), runId: run.id }], null)).toEqual([]);
      expect(await taskRow(db.pool, id)).toMatchObject({ state: 'running', attempts: 2 });
      expect(await taskRow(db.pool, run.tasks.b!)).toMatchObject({ state: 'pending', waiting_on: 1 });
    }
  });
});

describe('keepSucceeded: false', () => {
  const count = async (name: string) =>
    (await db.pool.query(`SELECT count(*)::int AS n FROM outlive.tasks WHERE name = $1`, [name])).rows[0].n as number;

  it('deletes the row of a success, and keeps retries and failures', async () => {
    await clear();
    let calls = 0;
    const ping = defineTask({ name: 'ping', input: z.object({ n: z.number() }), keepSucceeded: false, run: ({ n }) => n });
    const flaky = defineTask({
      name: 'flaky-ping',
      input: z.object({}),
      keepSucceeded: false,
      retry: { maxAttempts: 2, backoff: { baseMs: 1_000, jitter: 'none' } },
      run: () => {
        if (++calls === 1) throw new Error('first try');
        throw new NonRetriableError('gave up');
      },
    });
    for (let n = 0; n < 5; n++) await enqueue(db.pool, ping, { n }, { runAt: T0 });
    const { id } = await enqueue(db.pool, flaky, {}, { runAt: T0 });

    let report = await tick(db.pool, { tasks: [ping, flaky], now: T0 });
    expect(report).toMatchObject({ claimed: 6, succeeded: 5, retried: 1, lostLeases: 0 });
    expect(await count('ping')).toBe(0);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'pending', last_error: 'first try' });

    report = await tick(db.pool, { tasks: [ping, flaky], now: at(1_000) });
    expect(report).toMatchObject({ claimed: 1, failed: 1 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'failed', last_error: 'gave up', attempts: 2 });
  });

  it('settles a batch mixing kept and dropped successes in one transaction', async () => {
    await clear();
    const dropped = defineTask({ name: 'dropped', input: z.object({}), keepSucceeded: false, run: () => 'gone' });
    const kept = defineTask({ name: 'kept', input: z.object({}), run: () => 'stays' });
    await enqueue(db.pool, dropped, {});
    const { id } = await enqueue(db.pool, kept, {});
    await enqueue(db.pool, dropped, {});
    const report = await tick(db.pool, { tasks: [dropped, kept] });
    expect(report).toMatchObject({ claimed: 3, succeeded: 3, lostLeases: 0 });
    expect(await count('dropped')).toBe(0);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', output: 'stays' });
  });

  it('deletes only under the lease that claimed the row', async () => {
    await clear();
    const ping = defineTask({ name: 'ping', input: z.object({}), keepSucceeded: false, run: () => null });
    const { id } = await enqueue(db.pool, ping, {});
    const pass = withPreparedStatements(db.pool);
    const [claimed] = await claim(toExecutor(pass), {
      owner: 'pass-a', limit: 1, maxTimeoutMs: 60_000, queues: null, names: ['ping'], leaseGraceMs: 1_000, leaseMs: 60_000, now: null,
    });
    expect(claimed!.id).toBe(id);
    const success = { id, runId: null, attempt: 1, state: 'succeeded' as const, output: null, drop: true as const };
    // A pass that does not hold the lease (its own expired and was recovered) deletes nothing.
    expect(await settle(pass, 'pass-b', [success], null)).toEqual([]);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'running', lease_owner: 'pass-a' });
    expect(await settle(pass, 'pass-a', [success], null)).toEqual([{ id, state: 'succeeded', run_id: null, step: null }]);
    expect(await taskRow(db.pool, id)).toBeUndefined();
  });

  it('keeps the steps of a run, whose outputs feed the steps after them', async () => {
    await clear();
    const fetchPage = defineTask({ name: 'fetch-page', input: z.object({ url: z.string() }), keepSucceeded: false, run: ({ url }) => url.length });
    const sum = defineTask({
      name: 'sum-pages',
      input: z.object({}),
      keepSucceeded: false,
      run: async (_input, ctx) => Object.values(await ctx.outputs()).reduce((a, b) => (a as number) + (b as number), 0),
    });
    const run = await startRun(db.pool, 'pages', {
      a: step(fetchPage, { url: 'https://a.example' }),
      b: step(fetchPage, { url: 'https://bb.example' }),
      total: step(sum, {}, { after: ['a', 'b'] }),
    });
    await tick(db.pool, { tasks: [fetchPage, sum] });
    const { rows } = await db.pool.query(`SELECT step, state, output FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    expect(rows).toEqual([
      { step: 'a', state: 'succeeded', output: 17 },
      { step: 'b', state: 'succeeded', output: 18 },
      { step: 'total', state: 'succeeded', output: 35 },
    ]);
  });

  it('refuses a value that is not a boolean', () => {
    expect(() => defineTask({ name: 'x', input: z.object({}), keepSucceeded: 'no' as unknown as boolean, run: () => 1 })).toThrow(ConfigError);
    expect(() => defineTask({ name: 'x', input: z.object({}), keepSucceeded: 'no' as unknown as boolean, run: () => 1 })).toThrow(/keepSucceeded must be true or false/);
  });
});

describe('settle plans', () => {
  // A settle joins the batch (arrays unnested) to its rows. Prepared
  // statements switch to a generic plan after a few runs, which sees the
  // arrays as 10 rows. A plan that rescans the unnested batch once per row
  // (a nested loop with a join filter) is quadratic in the batch: a lease
  // index tried with the owner as a second column invited it on a table
  // without statistics yet, and one settle of 6,442 run tasks took 13.9 s
  // (a 10,000-task fan-out: 0.7 s -> 12.4 s). Every settle statement,
  // planned generically on a table shaped like a big fan-out, must join in
  // linear time.
  it('join the batch to its rows in linear time, even as generic plans', async () => {
    await clear();
    const leaf = defineTask({ name: 'leaf', input: z.object({ i: z.number() }), run: () => null });
    await startRun(db.pool, 'fan-out', fanOut(leaf, 3_000, (i) => ({ i })));
    // The leaves running under one pass, a few under others, and history.
    await db.pool.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = CASE WHEN id % 100 = 0 THEN 'other' ELSE 'mine' END,
                                lease_expires_at = now() + interval '35 s', started_at = now(), waiting_on = 0 WHERE step LIKE 'l%'`);
    await db.pool.query(`INSERT INTO outlive.tasks (name, state, input, attempts, max_attempts, timeout_ms, finished_at)
                         SELECT 'done', 'succeeded', '{}', 1, 3, 30000, now() FROM generate_series(1, 20000)`);
    const client = await db.direct.connect();
    try {
      await client.query('SET plan_cache_mode = force_generic_plan');
      const statements = { SETTLE_SQL, SUCCEED_SQL, SETTLE_RUN_TASKS_SQL, SUCCEED_RUN_TASKS_SQL, DROP_SQL };
      // Values for the parameters of the two shapes of settle (plain and run-task ones share them).
      const succeedArgs = `NULL, '{1,2}', '{null,null}', 'mine', '{1,1}'`;
      const settleArgs = `NULL, '{1,2}', '{succeeded,failed}', '{null,null}', '{null,null}', '{0,0}', '{null,null}', 'mine', '{1,1}'`;
      const dropArgs = `'{1,2}', 'mine', '{1,1}'`;
      const quadratic: string[] = [];
      // Planned before the table's statistics catch up (autovacuum's analyze
      // runs behind a burst like this one), and after.
      for (const analyzed of [false, true]) {
        if (analyzed) await client.query('ANALYZE');
        for (const [name, sql] of Object.entries(statements)) {
          await client.query(`PREPARE generic_settle AS ${sql}`);
          const [{ 'QUERY PLAN': [plan] }] = (
            await client.query(`EXPLAIN (FORMAT JSON) EXECUTE generic_settle(${name === 'DROP_SQL' ? dropArgs : name.startsWith('SUCCEED') ? succeedArgs : settleArgs})`)
          ).rows;
          await client.query('DEALLOCATE generic_settle');
          const walk = (node: Record<string, unknown>): void => {
            const children = (node['Plans'] as Record<string, unknown>[] | undefined) ?? [];
            const rescanned = children.some((c) => c['Node Type'] === 'Function Scan' && c['Parent Relationship'] === 'Inner');
            if (node['Node Type'] === 'Nested Loop' && node['Join Filter'] && rescanned) {
              quadratic.push(`${name}${analyzed ? '' : ' (no statistics)'}: ${String(node['Join Filter'])}`);
            }
            children.forEach(walk);
          };
          walk(plan['Plan']);
        }
      }
      expect(quadratic).toEqual([]);
    } finally {
      await client.query('RESET plan_cache_mode');
      client.release();
    }
  });

  // A pass settles and extends only the rows it holds, found by its lease
  // owner. With the lease index keyed by expiry alone, a settle planned on
  // statistics from before a burst (or cached as a generic plan) read every
  // running row of every pass through it: a settle of 5 tasks read 20,005
  // rows here, and one of one task cost 5.6 ms of Postgres CPU with 50,000
  // running elsewhere (0.25 ms keyed by owner).
  it("read only their own pass's rows, however many other passes hold and whatever the statistics say", async () => {
    await clear();
    await db.pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms)
                         SELECT 'noop', '{}', 3, 30000 FROM generate_series(1, 20100)`);
    // Statistics of a quiet moment: nothing running.
    await db.pool.query('ANALYZE outlive.tasks');
    await db.pool.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'other', lease_expires_at = now() + interval '1 hour'
                         WHERE id IN (SELECT id FROM outlive.tasks ORDER BY id DESC LIMIT 20000)`);
    const client = await db.direct.connect();
    const read: string[] = [];
    try {
      const mine = await claim(toExecutor(client), { owner: 'mine', limit: 5, maxTimeoutMs: 60_000, queues: null, names: ['noop'], leaseGraceMs: 5_000, leaseMs: 60_000, now: null });
      expect(mine).toHaveLength(5);
      const a = settleArgs(mine, 'mine');
      const statements: [string, string, string][] = [
        ['SUCCEED_SQL', SUCCEED_SQL, a.succeed],
        ['SETTLE_SQL', SETTLE_SQL, a.settle],
        ['SUCCEED_RUN_TASKS_SQL', SUCCEED_RUN_TASKS_SQL, a.succeed],
        ['DROP_SQL', DROP_SQL, a.drop],
        ['LOST_SQL', LOST_SQL, a.lost],
      ];
      for (const mode of ['force_custom_plan', 'force_generic_plan']) {
        await client.query(`SET plan_cache_mode = ${mode}`);
        for (const [name, sql, args] of statements) {
          await client.query('BEGIN');
          await client.query(`PREPARE own_rows AS ${sql}`).catch((e) => { throw new Error(`${name}: ${e.message}`); });
          const [{ 'QUERY PLAN': [plan] }] = (await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE own_rows(${args})`).catch((e) => { throw new Error(`${name} ${mode}: ${e.message}`); })).rows;
          await client.query('ROLLBACK');
          await client.query('DEALLOCATE own_rows');
          const rows = tasksRowsRead(plan['Plan']);
          if (rows > 50) read.push(`${name} (${mode}): ${rows} rows`);
        }
      }
    } finally {
      // A statement that failed left its transaction open.
      await client.query('ROLLBACK');
      await client.query('RESET plan_cache_mode');
      client.release();
    }
    expect(read).toEqual([]);
  });

  // The settles are named statements, and a worker that starts on an empty
  // queue makes its first ones on a table of a few rows, with no statistics
  // yet. After five runs Postgres caches a generic plan, made for that
  // table, and keeps it as a burst arrives until an ANALYZE replaces it (the
  // claim, once named too, was caught this way: ~1 s a claim of 500). The
  // settles' cached plans must still find the pass's own rows by its lease
  // owner, not read the other passes' running rows or the whole table.
  it('cached as generic plans while the table was nearly empty, still read only their own rows after a burst', async () => {
    const fresh = await freshDb();
    const client = await fresh.pool.connect();
    // Every settle on this one connection, so its named statements count their runs.
    const query = client.query.bind(client) as PoolLike['query'];
    const one: PoolLike = { query, connect: async () => ({ query, release: () => undefined }) };
    const exec = toExecutor(client);
    const request = { owner: 'pass', maxTimeoutMs: 60_000, queues: null, names: ['idle', 'burst'], leaseGraceMs: 1_000, leaseMs: 30_000, now: null };
    const error = { attempt: 1, at: T0.toISOString(), name: 'Error', message: 'again' };
    try {
      for (let i = 0; i < 12; i++) {
        await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'idle', '{}', 3, 1000 FROM generate_series(1, 3)`);
        const [a, b, c] = await claim(exec, { ...request, limit: 3 });
        expect(await settle(one, 'pass', [{ id: a!.id, runId: null, attempt: 1, state: 'succeeded', output: null }], null)).toHaveLength(1);
        expect(await settle(one, 'pass', [{ id: b!.id, runId: null, attempt: 1, state: 'succeeded', output: null, drop: true }], null)).toHaveLength(1);
        expect(await settle(one, 'pass', [{ id: c!.id, runId: null, attempt: 1, state: 'pending', retryAt: null, delayMs: 60_000, error }], null)).toHaveLength(1);
      }
      const { rows: cached } = await client.query<{ name: string; generic: number }>(
        `SELECT name, generic_plans::int AS generic FROM pg_prepared_statements WHERE name LIKE 'outlive_%' AND name NOT LIKE 'outlive_claim%' ORDER BY name`,
      );
      // The premise: each settle statement has been running its cached generic plan.
      expect(cached.map((s) => s.name)).toEqual(['outlive_drop_v4', 'outlive_settle_v5', 'outlive_succeed_v4']);
      for (const s of cached) expect(s.generic).toBeGreaterThan(0);

      // The burst: 20,000 rows running under other passes, 20,000 ready.
      await client.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'burst', '{}', 3, 1000 FROM generate_series(1, 40000)`);
      await client.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'other', lease_expires_at = now() + interval '1 hour'
                          WHERE id IN (SELECT id FROM outlive.tasks WHERE state = 'pending' ORDER BY id DESC LIMIT 20000)`);
      const mine = await claim(exec, { ...request, limit: 500 });
      expect(mine).toHaveLength(500);
      const a = settleArgs(mine, 'pass');
      const args: Record<string, string> = { outlive_succeed_v4: a.succeed, outlive_drop_v4: a.drop, outlive_settle_v5: a.settle };
      const read: string[] = [];
      for (const [name, values] of Object.entries(args)) {
        await client.query('BEGIN');
        // EXECUTE runs the statement the protocol prepared, with its cached plan.
        const [{ 'QUERY PLAN': [plan] }] = (await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ${name}(${values})`)).rows;
        await client.query('ROLLBACK');
        const rows = tasksRowsRead(plan['Plan']);
        if (rows > 600) read.push(`${name}: ${rows} rows`);
      }
      expect(read).toEqual([]);
      // And the settle itself, through the same cached plan.
      expect(await settle(one, 'pass', mine.map((t) => ({ id: t.id, runId: null, attempt: t.attempts, state: 'succeeded' as const, output: null })), null)).toHaveLength(500);
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });
});

// A deadlock (or a serialization failure) says nothing about the outcome:
// the same write may land a moment later. Recorded as the task's failure,
// it turned a lock meeting (a settle and a cancel of one run, each locking
// some of its tasks) into a task failed for good.
describe('a settle the database fails for a moment', () => {
  /** Makes the next `times` writes of task `id`'s success fail as a deadlock's victim. */
  async function deadlockSettlesOf(id: string, times: number) {
    const fresh = `fake_deadlock_${id}`;
    await db.pool.query(`CREATE SEQUENCE ${fresh}`);
    await db.pool.query(`CREATE FUNCTION ${fresh}() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF nextval('${fresh}') <= ${times} THEN RAISE EXCEPTION 'deadlock detected (made by the test)' USING ERRCODE = '40P01'; END IF;
        RETURN NEW;
      END $$`);
    await db.pool.query(`CREATE TRIGGER ${fresh} BEFORE UPDATE ON outlive.tasks FOR EACH ROW
                         WHEN (OLD.id = ${Number(id)} AND NEW.state = 'succeeded') EXECUTE FUNCTION ${fresh}()`);
    return () => db.pool.query(`DROP TRIGGER ${fresh} ON outlive.tasks; DROP FUNCTION ${fresh}(); DROP SEQUENCE ${fresh}`);
  }

  it('is tried again until it lands, and the task succeeds', async () => {
    const ok = defineTask({ name: 'lands-later', input: z.object({ n: z.number() }), run: ({ n }) => n });
    const a = await enqueue(db.pool, ok, { n: 1 });
    const b = await enqueue(db.pool, ok, { n: 2 });
    const undo = await deadlockSettlesOf(b.id, 3);
    try {
      expect(await tick(db.pool, { tasks: [ok], concurrency: 2 })).toMatchObject({ succeeded: 2, failed: 0 });
    } finally {
      await undo();
    }
    expect(await taskRow(db.pool, a.id)).toMatchObject({ state: 'succeeded', output: 1 });
    expect(await taskRow(db.pool, b.id)).toMatchObject({ state: 'succeeded', output: 2, last_error: null });
  });

  it('keeps its lease when it never lands (for recovery to hand back): the pass says so, and the others settle', async () => {
    const ok = defineTask({ name: 'never-lands', input: z.object({ n: z.number() }), run: ({ n }) => n });
    const a = await enqueue(db.pool, ok, { n: 1 });
    const b = await enqueue(db.pool, ok, { n: 2 });
    const undo = await deadlockSettlesOf(b.id, 1_000);
    let err: unknown;
    try {
      err = await tick(db.pool, { tasks: [ok], concurrency: 2 }).catch((e: unknown) => e);
    } finally {
      await undo();
    }
    expect(err).toBeInstanceOf(PassError);
    expect((err as PassError).message).toMatch(/deadlock detected/);
    expect((err as PassError).report).toMatchObject({ succeeded: 1, failed: 0 });
    expect(await taskRow(db.pool, a.id)).toMatchObject({ state: 'succeeded' });
    expect(await taskRow(db.pool, b.id)).toMatchObject({ state: 'running', last_error: null });
  });
});
