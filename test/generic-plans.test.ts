/**
 * Postgres may plan any prepared statement generically, without its
 * parameters' values: after five executions when the generic plan looks no
 * dearer than the custom ones (plan_cache_mode = auto, the default), and
 * always under force_generic_plan, which an operator may set. This file
 * records every statement a worker's work sends (passes with plain tasks,
 * retries, failures, runs with fan-out, spawns and skips, tasks with limits
 * and fairness, heartbeats,
 * recovery, retention, schedules), then plans each one generically on a
 * database shaped like a busy one (tens of thousands of finished rows, a
 * 30,000-edge run, a large fan-out, running work) and fails on a plan that
 * reads the whole of outlive.tasks or outlive.task_deps, or rescans an
 * unnested array once per row.
 */
import { createRequire } from 'node:module';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  applyRetention,
  enqueueMany,
  defineSchedule,
  defineTask,
  enqueue,
  enqueueDue,
  NonRetriableError,
  recover,
  startRun,
  step,
  tick,
} from '../src/index.js';
import { freshDb } from './support/db.js';
import { fanOut } from './support/tasks.js';

const db = await freshDb();
// node-postgres' own conversion of a parameter to its text form.
const { prepareValue } = createRequire(import.meta.url)('pg/lib/utils.js') as { prepareValue: (v: unknown) => string | null };

// Every statement the engine sends through node-postgres while recording, by text.
const seen = new Map<string, unknown[]>();
let recording = false;
const query = pg.Client.prototype.query;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  const [first, second] = args as [unknown, unknown];
  const text = typeof first === 'string' ? first : (first as { text?: string } | null)?.text;
  const values = Array.isArray(second) ? second : (first as { values?: unknown[] } | null)?.values;
  if (recording && text && values && values.length > 0 && !seen.has(text)) seen.set(text, values);
  return (query as (...a: unknown[]) => unknown).apply(this, args);
} as typeof query;
afterAll(() => {
  pg.Client.prototype.query = query;
});

const T0 = new Date('2026-03-01T12:00:00Z');
const at = (ms: number) => new Date(T0.getTime() + ms);

async function workload() {
  let flaky = 0;
  const ok = defineTask({ name: 'ok', input: z.object({ n: z.number() }), run: ({ n }) => ({ n }) });
  const gone = defineTask({ name: 'gone', input: z.object({}), keepSucceeded: false, run: () => null });
  const retried = defineTask({
    name: 'retried',
    input: z.object({}),
    retry: { maxAttempts: 3, backoff: { baseMs: 1_000, jitter: 'none' } },
    run: () => {
      if (++flaky === 1) throw new Error('once');
      return 'fine';
    },
  });
  const broken = defineTask({ name: 'broken', input: z.object({}), run: () => Promise.reject(new NonRetriableError('no')) });
  const slow = defineTask({
    name: 'slow',
    input: z.object({}),
    timeoutMs: 60_000,
    async run(_input, ctx) {
      await new Promise((r) => setTimeout(r, 150));
      return ctx.heartbeat();
    },
  });
  const page = defineTask({ name: 'page', input: z.object({ i: z.number() }), run: ({ i }) => i });
  const sum = defineTask({ name: 'sum', input: z.object({}), run: async (_i, ctx) => Object.keys(await ctx.outputs()).length });
  const first = defineTask({ name: 'first', input: z.object({}), run: async (_i, ctx) => ctx.output('a') });
  const fanOut = defineTask({
    name: 'fan-out',
    input: z.object({}),
    run: (_i, ctx) => {
      for (let i = 0; i < 5; i++) ctx.spawn(`p${i}`, step(page, { i }));
      ctx.spawn('sum', step(sum, {}, { after: ['p0', 'p1', 'p2', 'p3', 'p4'] }));
    },
  });
  let throttled = 0;
  const limited = defineTask({
    name: 'limited',
    input: z.object({ c: z.string() }),
    retry: { maxAttempts: 3, backoff: { baseMs: 1_000, jitter: 'none' } },
    limits: [{ key: 'api', concurrency: 2 }, { key: 'tokens', rate: { limit: 100, periodMs: 60_000 }, cost: 10 }],
    fairness: { key: (i) => i.c },
    run: (_i, ctx) => {
      if (++throttled === 1) throw new Error('once');
      ctx.reportCost(5);
    },
  });
  const tasks = [ok, gone, retried, broken, slow, page, sum, first, fanOut];
  await enqueueMany(db.pool, limited, [{ c: 'a' }, { c: 'a' }, { c: 'b' }]);
  await startRun(db.pool, 'limited', { a: step(limited, { c: 'a' }), b: step(limited, { c: 'b' }, { after: ['a'] }) });

  for (let n = 0; n < 3; n++) await enqueue(db.pool, ok, { n }, { key: `k${n}` });
  await enqueue(db.pool, gone, {});
  await enqueue(db.pool, retried, {});
  await enqueue(db.pool, broken, {});
  await enqueue(db.pool, slow, {});
  await startRun(db.pool, 'crawl', { root: step(fanOut, {}) });
  await startRun(db.pool, 'chain', { a: step(ok, { n: 1 }), b: step(first, {}, { after: ['a'] }) });
  // A run whose first step fails: the steps after it are skipped.
  await startRun(db.pool, 'doomed', { a: step(broken, {}), b: step(ok, { n: 2 }, { after: ['a'] }) });
  for (let i = 0; i < 5; i++) await tick(db.pool, { tasks, leaseCheckMs: 50 });
  // Tasks with flow control in passes of their own (a batch that mixes them
  // with plain tasks settles through the governed statement alone).
  const later = Date.now() + 60_000;
  for (let i = 0; i < 4; i++) await tick(db.pool, { tasks: [limited], now: new Date(later + i * 5_000) });
  await tick(db.pool, { tasks, now: at(10 * 86_400_000) });

  // A lease that ran out under a pass that died.
  const { id } = await enqueue(db.pool, ok, { n: 9 });
  recording = false;
  await db.pool.query(
    `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = now() - interval '1 minute' WHERE id = $1`,
    [id],
  );
  recording = true;
  await recover(db.pool);
  await applyRetention(db.pool, { now: at(400 * 86_400_000) });
  const nightly = defineSchedule({ name: 'nightly', cron: '0 3 * * *', task: ok, input: { n: 0 } });
  await enqueueDue(db.pool, [nightly], { now: T0 });
  await enqueueDue(db.pool, [nightly], { now: at(86_400_000) });
}

/** Rows like a queue's after a busy while: history, a large run, and some pending and running work. */
async function busyHistory() {
  await db.pool.query(`
    INSERT INTO outlive.tasks (name, state, input, output, attempts, max_attempts, timeout_ms, started_at, finished_at, created_at)
    SELECT 'ok', 'succeeded', '{}', 'null', 1, 5, 15000, now() - g * interval '1 s', now() - g * interval '1 s', now() - g * interval '1 s'
    FROM generate_series(1, 30000) g`);
  // A finished run of 30,000 steps in a chain: 30,000 edges.
  await db.pool.query(`
    WITH run AS (INSERT INTO outlive.runs (name, state, unfinished, finished_at) VALUES ('old', 'succeeded', 0, now()) RETURNING id),
    steps AS (
      INSERT INTO outlive.tasks (run_id, step, name, state, input, output, attempts, max_attempts, timeout_ms, finished_at)
      SELECT run.id, 's' || g, 'ok', 'succeeded', '{}', 'null', 1, 5, 15000, now() FROM run, generate_series(1, 30000) g
      RETURNING id, run_id, step)
    INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
    SELECT c.run_id, c.id, p.id FROM steps c JOIN steps p ON p.step = 's' || (substr(c.step, 2)::int - 1)`);
  const leaf = defineTask({ name: 'page', input: z.object({ i: z.number() }), run: () => null });
  await startRun(db.pool, 'big', fanOut(leaf, 3_000, (i) => ({ i })));
  await db.pool.query(`
    INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms)
    SELECT 'ok', jsonb_build_object('n', g), 5, 15000 FROM generate_series(1, 2000) g`);
  await db.pool.query(`
    UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'busy', lease_expires_at = now() + interval '1 minute'
    WHERE id IN (SELECT id FROM outlive.tasks WHERE state = 'pending' AND run_id IS NULL ORDER BY id LIMIT 500)`);
}

/** What is wrong with a plan: whole-table reads of the big tables, and joins that rescan an unnested array per row. */
function problems(plan: Record<string, unknown>): string[] {
  const found: string[] = [];
  const walk = (node: Record<string, unknown>) => {
    const children = (node['Plans'] as Record<string, unknown>[] | undefined) ?? [];
    if (node['Node Type'] === 'Seq Scan' && ['tasks', 'task_deps'].includes(node['Relation Name'] as string)) {
      found.push(`Seq Scan on ${String(node['Relation Name'])}`);
    }
    const rescanned = children.some((c) => c['Node Type'] === 'Function Scan' && c['Parent Relationship'] === 'Inner');
    if (node['Node Type'] === 'Nested Loop' && node['Join Filter'] && rescanned) found.push(`Nested Loop rescanning an array: ${String(node['Join Filter'])}`);
    children.forEach(walk);
  };
  walk(plan);
  return found;
}

describe('generic plans', () => {
  it('of every statement a worker sends read only what they need, on a busy database', async () => {
    recording = true;
    try {
      await workload();
    } finally {
      recording = false;
    }
    const statements = [...seen].filter(([text]) => /^\s*(WITH|SELECT|INSERT|UPDATE|DELETE)\b/i.test(text));
    // The workload reaches the claim, the settles, recovery, retention and the
    // schedules, and the settles of tasks with flow control (s.flow). The
    // claim is a call of outlive.claim_tasks, whose own plan is
    // checked in test/claim.test.ts.
    const kinds = ['outlive.claim_tasks(', 'UPDATE outlive.tasks t\nSET state = \'succeeded\'', 'DELETE FROM outlive.tasks t', 'WITH expired AS', 'WITH doomed AS', 'outlive.schedules', 's.flow::jsonb'];
    for (const kind of kinds) expect(statements.some(([text]) => text.includes(kind)), kind).toBe(true);
    expect(statements.length).toBeGreaterThan(20);

    await busyHistory();
    const client = await db.direct.connect();
    const bad: string[] = [];
    try {
      await client.query('SET plan_cache_mode = force_generic_plan');
      // Planned before the table's statistics catch up, and after.
      for (const analyzed of [false, true]) {
        if (analyzed) await client.query('ANALYZE');
        for (const [text, values] of statements) {
          await client.query(`PREPARE generic AS ${text}`);
          try {
            const args = values.map((v) => {
              const text = prepareValue(v);
              return text === null ? 'NULL' : client.escapeLiteral(text);
            });
            const { rows } = await client.query(`EXPLAIN (FORMAT JSON) EXECUTE generic(${args.join(', ')})`);
            for (const p of problems(rows[0]['QUERY PLAN'][0]['Plan'])) {
              bad.push(`${p}${analyzed ? '' : ' (no statistics)'}: ${text.trim().replace(/\s+/g, ' ').slice(0, 90)}`);
            }
          } finally {
            await client.query('DEALLOCATE generic');
          }
        }
      }
    } finally {
      await client.query('RESET plan_cache_mode');
      client.release();
    }
    expect(bad).toEqual([]);
  });
});
