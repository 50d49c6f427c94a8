import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  cancelRun,
  defineTask,
  explainRun,
  InvalidEnqueueError,
  InvalidGraphError,
  NonRetriableError,
  recover,
  startRun,
  step,
  tick,
  type AnyTask,
} from '../src/index.js';
import { startRunStatement } from '../src/write/start-run.js';
import { freshDb } from './support/db.js';
import { fanOut } from './support/tasks.js';

const db = await freshDb();
await db.pool.query(`CREATE TABLE log (seq bigserial, task_id bigint, step text, at timestamptz DEFAULT clock_timestamp())`);

async function clear() {
  await db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks; DELETE FROM log');
}

/** A task that logs its step and returns it. */
const work = defineTask({
  name: 'work',
  input: z.object({ label: z.string(), fail: z.boolean().optional(), sleepMs: z.number().optional() }),
  retry: { maxAttempts: 1 },
  async run({ label, fail, sleepMs }, ctx) {
    if (sleepMs) await new Promise((r) => setTimeout(r, sleepMs));
    await db.pool.query('INSERT INTO log (task_id, step) VALUES ($1, $2)', [ctx.taskId, label]);
    if (fail) throw new NonRetriableError(`${label} broke`);
    return { label };
  },
});

async function drain(tasks: AnyTask[], passes = 1, options: { concurrency?: number } = {}) {
  for (let i = 0; i < 200; i++) {
    const reports = await Promise.all(Array.from({ length: passes }, () => tick(db.pool, { tasks, concurrency: options.concurrency ?? 4 })));
    if (reports.every((r) => r.claimed === 0)) return;
  }
  throw new Error('did not drain');
}

const order = async () => (await db.rows<{ step: string }>('SELECT step FROM log ORDER BY seq')).map((r) => r.step);
const runRow = async (id: string) => (await db.rows(`SELECT state::text, unfinished, error, failed_task_id::text FROM outlive.runs WHERE id = $1`, [id]))[0];

describe('runs', () => {
  // The edges of a run once found their tasks by joining the inserted rows
  // by step, which the planner estimated at 50 million rows for this graph:
  // that estimate alone switched on JIT compilation, 290 ms of 870.
  it('plans the statement that writes a 10,000-step fan-out cheaply enough to stay clear of JIT', async () => {
    const { text, values } = startRunStatement('fan-out', fanOut(work, 10_000, (i) => ({ label: `l${i}` })));
    const { rows } = await db.pool.query(`EXPLAIN (FORMAT JSON) ${text}`, values);
    const { rows: [jit] } = await db.pool.query(`SELECT current_setting('jit_above_cost')::float8 AS above`);
    expect(rows[0]['QUERY PLAN'][0]['Plan']['Total Cost']).toBeLessThan(jit.above);
  });

  it('runs a diamond in dependency order and succeeds when its last task does', async () => {
    await clear();
    const run = await startRun(db.pool, 'diamond', {
      a: step(work, { label: 'a' }),
      b: step(work, { label: 'b' }, { after: ['a'] }),
      c: step(work, { label: 'c' }, { after: ['a'] }),
      d: step(work, { label: 'd' }, { after: ['b', 'c'] }),
    });
    expect(Object.keys(run.tasks).sort()).toEqual(['a', 'b', 'c', 'd']);
    expect(await runRow(run.id)).toMatchObject({ state: 'running', unfinished: 4 });
    await drain([work]);
    const seen = await order();
    expect(seen[0]).toBe('a');
    expect(seen.slice(1, 3).sort()).toEqual(['b', 'c']);
    expect(seen[3]).toBe('d');
    expect(await runRow(run.id)).toMatchObject({ state: 'succeeded', unfinished: 0, error: null });
  });

  it('runs a deep chain in order', async () => {
    await clear();
    const steps = Object.fromEntries(
      Array.from({ length: 60 }, (_, i) => [`s${i}`, step(work, { label: `s${i}` }, { after: i ? [`s${i - 1}`] : [] })]),
    );
    const run = await startRun(db.pool, 'chain', steps);
    await drain([work]);
    expect(await order()).toEqual(Array.from({ length: 60 }, (_, i) => `s${i}`));
    expect((await runRow(run.id))!.state).toBe('succeeded');
  });

  it('two passes claiming from one wide run never run a task twice or before its dependencies', async () => {
    await clear();
    const steps: Record<string, ReturnType<typeof step<typeof work>>> = { root: step(work, { label: 'root' }) };
    for (let i = 0; i < 40; i++) steps[`m${i}`] = step(work, { label: `m${i}` }, { after: ['root'] });
    for (let i = 0; i < 40; i++) steps[`n${i}`] = step(work, { label: `n${i}` }, { after: [`m${i}`, `m${(i + 1) % 40}`] });
    steps.end = step(work, { label: 'end' }, { after: Array.from({ length: 40 }, (_, i) => `n${i}`) });
    const run = await startRun(db.pool, 'wide', steps);
    await drain([work], 2);
    const logs = await db.rows<{ task_id: string; n: number }>(`SELECT task_id::text, count(*)::int n FROM log GROUP BY 1`);
    expect(logs).toHaveLength(82);
    expect(logs.every((l) => l.n === 1)).toBe(true);
    // Every task started after each of its dependencies had succeeded.
    const violations = await db.rows(`
      SELECT c.step FROM outlive.task_deps d
      JOIN outlive.tasks c ON c.id = d.task_id JOIN outlive.tasks p ON p.id = d.depends_on
      JOIN log lc ON lc.task_id = c.id
      WHERE c.run_id = $1 AND (p.finished_at IS NULL OR lc.at < p.finished_at)`, [run.id]);
    expect(violations).toEqual([]);
    expect((await runRow(run.id))!.state).toBe('succeeded');
  });

  it('passes outputs to the tasks that wait for them', async () => {
    await clear();
    const seen: unknown[] = [];
    const source = defineTask({ name: 'source', input: z.object({ n: z.number() }), run: ({ n }) => ({ n }) });
    const sink = defineTask({
      name: 'sink',
      input: z.object({}),
      async run(_i, ctx) {
        seen.push(await ctx.outputs(), await ctx.output<{ n: number }>('one'));
        return null;
      },
    });
    await startRun(db.pool, 'outputs', {
      one: step(source, { n: 1 }),
      two: step(source, { n: 2 }),
      sink: step(sink, {}, { after: ['one', 'two'] }),
    });
    await drain([source, sink]);
    expect(seen).toEqual([{ one: { n: 1 }, two: { n: 2 } }, { n: 1 }]);
  });

  it('fans out from a running task, with a final step that waits for every spawned one', async () => {
    await clear();
    const page = defineTask({ name: 'page', input: z.object({ i: z.number() }), run: async ({ i }, ctx) => {
      await db.pool.query('INSERT INTO log (task_id, step) VALUES ($1, $2)', [ctx.taskId, `page${i}`]);
      return { i };
    } });
    const finish = defineTask({ name: 'finish', input: z.object({}), run: async (_i, ctx) => {
      await db.pool.query('INSERT INTO log (task_id, step) VALUES ($1, $2)', [ctx.taskId, 'finish']);
      return Object.keys(await ctx.outputs()).length;
    } });
    const crawl = defineTask({ name: 'crawl', input: z.object({ pages: z.number() }), run: ({ pages }, ctx) => {
      const names = Array.from({ length: pages }, (_, i) => `page:${i}`);
      names.forEach((name, i) => ctx.spawn(name, step(page, { i })));
      ctx.spawn('finish', step(finish, {}, { after: names }));
      return { pages };
    } });
    const run = await startRun(db.pool, 'fan', { crawl: step(crawl, { pages: 150 }) });
    await drain([crawl, page, finish], 2);
    const seen = await order();
    expect(seen).toHaveLength(151);
    expect(seen.at(-1)).toBe('finish');
    const [fin] = await db.rows(`SELECT output FROM outlive.tasks WHERE run_id = $1 AND step = 'finish'`, [run.id]);
    expect(fin!.output).toBe(150);
    expect(await runRow(run.id)).toMatchObject({ state: 'succeeded', unfinished: 0 });
  });

  it('forgets the spawns of a failed attempt: a retry creates no duplicates', async () => {
    await clear();
    const child = defineTask({ name: 'child', input: z.object({ i: z.number() }), run: () => null });
    let attempts = 0;
    const parent = defineTask({
      name: 'parent',
      input: z.object({}),
      retry: { maxAttempts: 3, backoff: () => 0 },
      run: (_i, ctx) => {
        attempts++;
        for (let i = 0; i < 3; i++) ctx.spawn(`child:${i}`, step(child, { i }));
        if (ctx.attempt === 1) throw new Error('flaky after spawning');
        return null;
      },
    });
    const run = await startRun(db.pool, 'respawn', { parent: step(parent, {}) });
    await drain([parent, child]);
    expect(attempts).toBe(2);
    const rows = await db.rows<{ step: string; state: string }>(`SELECT step, state::text FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    expect(rows).toEqual([
      { step: 'child:0', state: 'succeeded' },
      { step: 'child:1', state: 'succeeded' },
      { step: 'child:2', state: 'succeeded' },
      { step: 'parent', state: 'succeeded' },
    ]);
    expect((await runRow(run.id))!.state).toBe('succeeded');
  });

  it('skips everything downstream of a failed task and fails the run naming it, after the other branches finish', async () => {
    await clear();
    const run = await startRun(db.pool, 'broken', {
      a: step(work, { label: 'a', fail: true }),
      b: step(work, { label: 'b' }, { after: ['a'] }),
      c: step(work, { label: 'c' }, { after: ['b'] }),
      x: step(work, { label: 'x', sleepMs: 50 }),
      y: step(work, { label: 'y' }, { after: ['x'] }),
    });
    await drain([work]);
    expect((await order()).sort()).toEqual(['a', 'x', 'y']);
    const states = await db.rows<{ step: string; state: string; last_error: string }>(
      `SELECT step, state::text, last_error FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    expect(states.map((s) => [s.step, s.state])).toEqual([
      ['a', 'failed'], ['b', 'skipped'], ['c', 'skipped'], ['x', 'succeeded'], ['y', 'succeeded'],
    ]);
    expect(states[1]!.last_error).toBe(`not run: upstream step "a" (task ${run.tasks.a}) failed`);
    expect(await runRow(run.id)).toMatchObject({ state: 'failed', unfinished: 0, failed_task_id: run.tasks.a, error: `step "a" (task ${run.tasks.a}) failed` });
  });

  it('fails the run when recovery fails a task that ran out of attempts', async () => {
    await clear();
    const run = await startRun(db.pool, 'dead-worker', {
      a: step(work, { label: 'a' }),
      b: step(work, { label: 'b' }, { after: ['a'] }),
    });
    await db.pool.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = now() - interval '1 minute' WHERE id = $1`, [run.tasks.a]);
    const r = await recover(db.pool);
    expect(r.failed).toBe(1);
    expect(await runRow(run.id)).toMatchObject({ state: 'failed', unfinished: 0 });
    expect((await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [run.tasks.b]))[0]).toEqual({ state: 'skipped' });
  });

  it('cancels a run: pending tasks at once, running ones through their signal, none retried', async () => {
    await clear();
    let aborted: unknown = null;
    const slow = defineTask({
      name: 'slow',
      input: z.object({}),
      timeoutMs: 20_000,
      run: (_i, ctx) => new Promise((resolve, reject) => {
        ctx.signal.addEventListener('abort', () => { aborted = ctx.signal.reason; reject(ctx.signal.reason); });
      }),
    });
    const run = await startRun(db.pool, 'to-cancel', {
      slow: step(slow, {}),
      later: step(work, { label: 'later' }, { after: ['slow'] }),
    });
    const pass = tick(db.pool, { tasks: [slow, work], leaseCheckMs: 50 });
    while ((await db.rows(`SELECT 1 FROM outlive.tasks WHERE id = $1 AND state = 'running'`, [run.tasks.slow])).length === 0) {
      await new Promise((r) => setTimeout(r, 10));
    }
    const report = await cancelRun(db.pool, run.id);
    expect(report).toEqual({ cancelled: true, state: 'cancelled', pendingCancelled: 1, runningCancelled: 1 });
    const passReport = await pass;
    expect((aborted as Error)?.name).toBe('LeaseLostError');
    expect(passReport).toMatchObject({ claimed: 1, lostLeases: 1, retried: 0 });
    const rows = await db.rows<{ step: string; state: string }>(`SELECT step, state::text FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    expect(rows).toEqual([{ step: 'later', state: 'cancelled' }, { step: 'slow', state: 'cancelled' }]);
    expect((await runRow(run.id))!.state).toBe('cancelled');
    expect(await cancelRun(db.pool, run.id)).toMatchObject({ cancelled: false, state: 'cancelled' });
    expect((await tick(db.pool, { tasks: [slow, work] })).claimed).toBe(0);
  });

  it('explains why each task is where it is', async () => {
    await clear();
    const T0 = new Date('2026-06-01T00:00:00Z');
    const flaky = defineTask({ name: 'flaky', input: z.object({}), retry: { maxAttempts: 3, backoff: { baseMs: 60_000, jitter: 'none' } }, run: () => { throw new Error('503'); } });
    const run = await startRun(db.pool, 'why', {
      first: step(flaky, {}, { runAt: T0 }),
      second: step(work, { label: 'second' }, { after: ['first'] }),
    });
    await tick(db.pool, { tasks: [flaky, work], now: T0 });
    const explained = await explainRun(db.pool, run.id, { now: T0 });
    expect(explained).toMatchObject({ name: 'why', state: 'running', counts: { pending: 2 } });
    expect(explained!.tasks.map((t) => [t.step, t.why])).toEqual([
      ['first', 'backing off until 2026-06-01T00:01:00.000Z after attempt 1 of 3 failed: 503'],
      ['second', 'waiting for "first" to succeed'],
    ]);
    expect(await explainRun(db.pool, '999999')).toBeNull();
  });
});

describe('rejected graphs write nothing', () => {
  const cases: Array<[string, () => Promise<unknown>, RegExp, new (...a: never[]) => Error]> = [
    ['a run with no steps', () => startRun(db.pool, 'empty', {}), /at least one step/, InvalidGraphError],
    ['a dependency on a step not in the run', () => startRun(db.pool, 'dangling', { a: step(work, { label: 'a' }, { after: ['ghost'] }) }), /waits for "ghost", which is not in the run/, InvalidGraphError],
    ['a step waiting for itself', () => startRun(db.pool, 'self', { a: step(work, { label: 'a' }, { after: ['a'] }) }), /waits for itself/, InvalidGraphError],
    ['a cycle', () => startRun(db.pool, 'cycle', {
      a: step(work, { label: 'a' }, { after: ['c'] }),
      b: step(work, { label: 'b' }, { after: ['a'] }),
      c: step(work, { label: 'c' }, { after: ['b'] }),
      d: step(work, { label: 'd' }),
    }), /dependency cycle: a -> c -> b -> a/, InvalidGraphError],
    ['an invalid step name', () => startRun(db.pool, 'bad', { '\n': step(work, { label: 'a' }) }), /step name .* is invalid/, InvalidGraphError],
    ['an invalid input in one step', () => startRun(db.pool, 'input', { a: step(work, { label: 'a' }), b: step(work, { label: 7 } as never) }), /input does not match its schema: label/, InvalidEnqueueError],
    ['something that is not a step', () => startRun(db.pool, 'raw', { a: { label: 'a' } as never }), /must be made with step/, InvalidGraphError],
  ];
  it.each(cases)('%s', async (_label, call, message, type) => {
    await clear();
    const err = await call().then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(type);
    expect((err as Error).message).toMatch(message);
    expect(await db.rows('SELECT 1 FROM outlive.runs')).toHaveLength(0);
    expect(await db.rows('SELECT 1 FROM outlive.tasks')).toHaveLength(0);
  });

  it('a spawn naming an unknown step fails that attempt and leaves nothing behind', async () => {
    await clear();
    const bad = defineTask({ name: 'bad-spawner', input: z.object({}), retry: { maxAttempts: 1 }, run: (_i, ctx) => {
      ctx.spawn('orphan', step(work, { label: 'o' }, { after: ['nowhere'] }));
      return null;
    } });
    const run = await startRun(db.pool, 'bad-spawn', { s: step(bad, {}) });
    await drain([bad, work]);
    const rows = await db.rows<{ step: string; state: string; last_error: string }>(`SELECT step, state::text, last_error FROM outlive.tasks WHERE run_id = $1`, [run.id]);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ step: 's', state: 'failed' });
    expect(rows[0]!.last_error).toMatch(/waits for "nowhere", which is not in the run/);
    expect((await runRow(run.id))!.state).toBe('failed');
  });
});

describe('spawned graphs are checked too', () => {
  it('a cycle among one attempt’s spawns fails the task at once, writing none of them', async () => {
    await clear();
    let calls = 0;
    const cyclic = defineTask({ name: 'cyclic-spawner', input: z.object({}), retry: { maxAttempts: 3 }, run: (_i, ctx) => {
      calls++;
      ctx.spawn('x', step(work, { label: 'x' }, { after: ['y'] }));
      ctx.spawn('y', step(work, { label: 'y' }, { after: ['x'] }));
      return null;
    } });
    const run = await startRun(db.pool, 'spawn-cycle', { s: step(cyclic, {}) });
    await drain([cyclic, work]);
    expect(calls).toBe(1);
    const rows = await db.rows<{ step: string; state: string; last_error: string }>(`SELECT step, state::text, last_error FROM outlive.tasks WHERE run_id = $1`, [run.id]);
    expect(rows).toEqual([{ step: 's', state: 'failed', last_error: expect.stringMatching(/dependency cycle: x -> y -> x/) }]);
  });

  it('spawning the same step twice throws inside the handler', async () => {
    await clear();
    const twice = defineTask({ name: 'twice', input: z.object({}), retry: { maxAttempts: 1 }, run: (_i, ctx) => {
      ctx.spawn('a', step(work, { label: 'a' }));
      ctx.spawn('a', step(work, { label: 'a' }));
    } });
    const run = await startRun(db.pool, 'spawn-twice', { s: step(twice, {}) });
    await drain([twice, work]);
    const rows = await db.rows<{ last_error: string }>(`SELECT last_error FROM outlive.tasks WHERE run_id = $1`, [run.id]);
    expect(rows).toEqual([{ last_error: expect.stringMatching(/spawned step "a" twice/) }]);
  });

  it('a task outside a run cannot spawn', async () => {
    await clear();
    const lonely = defineTask({ name: 'lonely', input: z.object({}), retry: { maxAttempts: 1 }, run: (_i, ctx) => ctx.spawn('a', step(work, { label: 'a' })) });
    const { enqueue } = await import('../src/index.js');
    const t = await enqueue(db.pool, lonely, {});
    await tick(db.pool, { tasks: [lonely] });
    expect((await db.rows<{ last_error: string }>(`SELECT last_error FROM outlive.tasks WHERE id = $1`, [t.id]))[0]!.last_error).toMatch(/spawn needs a task that belongs to a run/);
  });
});

describe('startRun inside a transaction', () => {
  it('is rolled back with the transaction', async () => {
    await clear();
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    await client.query('BEGIN');
    await startRun(client, 'rolled-back', { a: step(work, { label: 'a' }) });
    await client.query('ROLLBACK');
    await client.end();
    expect(await db.rows('SELECT 1 FROM outlive.runs')).toHaveLength(0);
  });
});

describe('the context a handler gets', () => {
  it('may be destructured: spawn, output, outputs, heartbeat and signal work unbound', async () => {
    await clear();
    const leaf = defineTask({
      name: 'ctx-leaf',
      input: z.object({ n: z.number() }),
      run: ({ n }, { heartbeat, signal }) => heartbeat().then((held) => ({ n, held, aborted: signal.aborted })),
    });
    const join = defineTask({
      name: 'ctx-join',
      input: z.object({}),
      run: async (_input, { output, outputs }) => ({ one: await output('leaf:1'), all: await outputs() }),
    });
    const root = defineTask({
      name: 'ctx-root',
      input: z.object({}),
      // Synchronous: returns without awaiting, so it settles from its value.
      run: (_input, { spawn, taskId, attempt }) => {
        spawn('leaf:1', step(leaf, { n: 1 }));
        spawn('leaf:2', step(leaf, { n: 2 }));
        spawn('join', step(join, {}, { after: ['leaf:1', 'leaf:2'] }));
        return { taskId, attempt };
      },
    });
    const run = await startRun(db.pool, 'ctx', { root: step(root, {}) });
    await drain([root, leaf, join]);
    expect(await runRow(run.id)).toMatchObject({ state: 'succeeded', unfinished: 0 });
    const rows = await db.rows<{ step: string; output: unknown }>(
      `SELECT step, output FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    const leafOut = (n: number) => ({ n, held: true, aborted: false });
    expect(rows).toEqual([
      { step: 'join', output: { one: leafOut(1), all: { 'leaf:1': leafOut(1), 'leaf:2': leafOut(2) } } },
      { step: 'leaf:1', output: leafOut(1) },
      { step: 'leaf:2', output: leafOut(2) },
      { step: 'root', output: { taskId: run.tasks.root, attempt: 1 } },
    ]);
  });
});
