/**
 * Waits and signals (issue 27): a step that waits for a signal or a time is
 * a row the claim finds only when it is due; a signal is a row, kept until a
 * wait takes it; order does not matter and nothing resumes twice.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  applyRetention,
  defineTask,
  enqueue,
  explainRun,
  recover,
  retryRun,
  InvalidGraphError,
  InvalidSignalError,
  signal,
  sleepStep,
  startRun,
  step,
  tick,
  waitFor,
  type AnyTask,
} from '../src/index.js';
import { getTask } from '../src/admin/queries.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
const T0 = new Date(Date.now() + 3_600_000);
const at = (ms: number) => new Date(T0.getTime() + ms);

async function clear() {
  await db.pool.query('DELETE FROM outlive.runs; DELETE FROM outlive.tasks; DELETE FROM outlive.task_deps; DELETE FROM outlive.signals');
}

const seen: unknown[] = [];
/** Records the outputs of the steps it waited for. */
const after = defineTask({
  name: 'after-wait',
  input: z.object({}),
  retry: { maxAttempts: 1 },
  async run(_input, ctx) {
    const outputs = await ctx.outputs();
    seen.push(outputs);
    return outputs;
  },
});
const request = defineTask({ name: 'request', input: z.object({ domain: z.string() }), run: ({ domain }) => ({ requested: domain }) });
const tasks: AnyTask[] = [after, request];

const pass = (now: Date, more: Partial<Parameters<typeof tick>[1]> = {}) => tick(db.pool, { tasks, now, ...more });

async function stepRow(runId: string, name: string) {
  const [row] = await db.rows<Record<string, unknown>>(
    `SELECT state::text, output, run_at, wait_key, wait_until, signal, lease_owner, attempts, max_attempts, snoozes, last_error, xmin::text AS xmin
     FROM outlive.tasks WHERE run_id = $1 AND step = $2`,
    [runId, name],
  );
  return row!;
}
const runState = async (id: string) => (await db.rows<{ state: string }>('SELECT state::text FROM outlive.runs WHERE id = $1', [id]))[0]!.state;

describe('waitFor', () => {
  it('parks until its signal, holding no lease and writing nothing, then hands the payload downstream', async () => {
    await clear();
    const run = await startRun(db.pool, 'verify', {
      request: step(request, { domain: 'a.example' }),
      verified: waitFor('dns:a.example', { after: ['request'], timeoutMs: 60_000 }),
      done: step(after, {}, { after: ['verified'] }),
    });
    const first = await pass(at(0));
    expect(first).toMatchObject({ succeeded: 1, parked: 1, failed: 0 });
    const parked = await stepRow(run.id, 'verified');
    expect(parked).toMatchObject({ state: 'pending', wait_key: 'dns:a.example', lease_owner: null, signal: null, snoozes: 1 });
    expect(new Date(parked.run_at as string).getTime()).toBe(at(60_000).getTime());
    const explained = await explainRun(db.pool, run.id, { now: at(1_000) });
    expect(explained!.tasks.find((t) => t.step === 'verified')!.why).toBe(`waiting for signal dns:a.example until ${at(60_000).toISOString()}`);
    expect((await getTask(db.pool, explained!.tasks.find((t) => t.step === 'verified')!.id))!.waiting).toMatch(/^waiting for signal dns:a\.example until /);
    // Passes before the deadline neither claim nor write it.
    expect(await pass(at(30_000))).toMatchObject({ claimed: 0, parked: 0, succeeded: 0 });
    expect((await stepRow(run.id, 'verified')).xmin).toBe(parked.xmin);

    expect(await signal(db.pool, 'dns:a.example', { verifiedAt: 'now' }, { id: 'check-1' })).toEqual({ delivered: 1, duplicate: false });
    // The same id again is the same signal.
    expect(await signal(db.pool, 'dns:a.example', { verifiedAt: 'again' }, { id: 'check-1' })).toEqual({ delivered: 0, duplicate: true });
    seen.length = 0;
    await pass(at(30_000));
    expect(await stepRow(run.id, 'verified')).toMatchObject({ state: 'succeeded', output: { verifiedAt: 'now' } });
    expect(seen).toEqual([{ verified: { verifiedAt: 'now' } }]);
    expect(await runState(run.id)).toBe('succeeded');
  });

  it('takes a signal sent before it began, kept until then', async () => {
    await clear();
    expect(await signal(db.pool, 'early', { n: 1 }, { id: 'e1' })).toEqual({ delivered: 0, duplicate: false });
    const run = await startRun(db.pool, 'early', { w: waitFor('early'), done: step(after, {}, { after: ['w'] }) });
    const r = await pass(at(0));
    expect(r).toMatchObject({ parked: 0, succeeded: 2 });
    expect(await stepRow(run.id, 'w')).toMatchObject({ state: 'succeeded', output: { n: 1 }, snoozes: 0 });
    const [kept] = await db.rows('SELECT consumed_at IS NOT NULL AS consumed, delivered FROM outlive.signals WHERE key = $1', ['early']);
    expect(kept).toEqual({ consumed: true, delivered: 1 });
    // Taken once: a second wait on the key does not get it again.
    const again = await startRun(db.pool, 'early-2', { w: waitFor('early') });
    expect(await pass(at(0))).toMatchObject({ parked: 1 });
    expect((await stepRow(again.id, 'w')).state).toBe('pending');
  });

  it('resumes once when two signals come for one wait', async () => {
    await clear();
    const run = await startRun(db.pool, 'twice', { w: waitFor('k2'), done: step(after, {}, { after: ['w'] }) });
    await pass(at(0));
    expect(await signal(db.pool, 'k2', 'first', { id: 'a' })).toEqual({ delivered: 1, duplicate: false });
    expect(await signal(db.pool, 'k2', 'second', { id: 'b' })).toEqual({ delivered: 0, duplicate: false });
    seen.length = 0;
    await pass(at(1_000));
    await pass(at(2_000));
    expect(await stepRow(run.id, 'w')).toMatchObject({ state: 'succeeded', output: 'first' });
    expect(seen).toHaveLength(1);
  });

  it('fails at its timeout, or succeeds with the value it was given', async () => {
    await clear();
    const failing = await startRun(db.pool, 'to-fail', { w: waitFor('never-1', { timeoutMs: 10_000 }), done: step(after, {}, { after: ['w'] }) });
    const valued = await startRun(db.pool, 'to-value', {
      w: waitFor('never-2', { timeoutMs: 10_000, onTimeout: { value: { verified: false } } }),
      done: step(after, {}, { after: ['w'] }),
    });
    expect(await pass(at(0))).toMatchObject({ parked: 2 });
    expect(await pass(at(9_999))).toMatchObject({ claimed: 0, parked: 0 });
    seen.length = 0;
    await pass(at(10_000));
    expect(await stepRow(failing.id, 'w')).toMatchObject({ state: 'failed', last_error: 'no signal "never-1" came within 10000 ms' });
    expect(await runState(failing.id)).toBe('failed');
    expect(await stepRow(valued.id, 'w')).toMatchObject({ state: 'succeeded', output: { verified: false } });
    expect(seen).toEqual([{ w: { verified: false } }]);
    expect(await runState(valued.id)).toBe('succeeded');
    // A signal after the wait ended is kept for a wait to come, and ends nothing.
    expect(await signal(db.pool, 'never-1', 'late')).toEqual({ delivered: 0, duplicate: false });
    expect((await stepRow(failing.id, 'w')).state).toBe('failed');
  });

  it('is spawned by a handler, like any step', async () => {
    await clear();
    const start = defineTask({
      name: 'start-call',
      input: z.object({}),
      run(_i, ctx) {
        ctx.spawn('callback', waitFor('openai:resp_1', { timeoutMs: 900_000 }));
        ctx.spawn('store', step(after, {}, { after: ['callback'] }));
        return { responseId: 'resp_1' };
      },
    });
    const run = await startRun(db.pool, 'page', { start: step(start, {}) });
    // The pass that ran the spawner claims what it spawned: the wait parks.
    expect(await tick(db.pool, { tasks: [start, after], now: at(0) })).toMatchObject({ succeeded: 1, parked: 1 });
    await signal(db.pool, 'openai:resp_1', { status: 'completed' }, { id: 'evt_1' });
    seen.length = 0;
    await tick(db.pool, { tasks: [start, after], now: at(1_000) });
    expect(seen).toEqual([{ callback: { status: 'completed' } }]);
    expect(await runState(run.id)).toBe('succeeded');
  });

  it('never misses a signal sent while it begins: one of the two sees the other', async () => {
    await clear();
    const runs: string[] = [];
    for (let i = 0; i < 40; i++) runs.push((await startRun(db.pool, 'race', { w: waitFor(`race:${i}`), done: step(after, {}, { after: ['w'] }) })).id);
    // Passes begin the waits while signals for the same keys commit.
    await Promise.all([
      pass(at(0), { concurrency: 2 }),
      ...runs.map((_, i) => signal(db.pool, `race:${i}`, i, { id: 'only' })),
    ]);
    for (let i = 0; i < 10; i++) await pass(at(1_000));
    const states = await db.rows<{ state: string; n: number }>(`SELECT state::text, count(*)::int AS n FROM outlive.runs GROUP BY 1`);
    expect(states).toEqual([{ state: 'succeeded', n: 40 }]);
    const [kept] = await db.rows<{ n: number }>('SELECT count(*)::int AS n FROM outlive.signals WHERE consumed_at IS NULL');
    expect(kept!.n).toBe(0);
  });

  it('keeps the signal it took when its pass dies before settling it', async () => {
    await clear();
    await signal(db.pool, 'taken', { n: 7 }, { id: 't1' });
    const run = await startRun(db.pool, 'taken', { w: waitFor('taken'), done: step(after, {}, { after: ['w'] }) });
    const id = run.tasks.w!;
    // A pass claims the wait and begins it (the kept signal is written onto the row), then dies.
    await db.pool.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = now() + interval '1 minute' WHERE id = $1`, [id]);
    const [begun] = await db.rows(`SELECT outcome, payload FROM outlive.begin_waits(ARRAY[$1]::bigint[], ARRAY[1], 'dead', NULL)`, [id]);
    expect(begun).toEqual({ outcome: 'signal', payload: { n: 7 } });
    await db.pool.query(`UPDATE outlive.tasks SET lease_expires_at = now() - interval '1 minute' WHERE id = $1`, [id]);
    expect(await recover(db.pool)).toMatchObject({ retried: 1 });
    seen.length = 0;
    for (let i = 0; i < 3; i++) await pass(at(600_000));
    expect(await stepRow(run.id, 'w')).toMatchObject({ state: 'succeeded', output: { n: 7 } });
    expect(seen).toEqual([{ w: { n: 7 } }]);
  });

  it('begins afresh when retried by hand after it timed out', async () => {
    await clear();
    const run = await startRun(db.pool, 'retried', { w: waitFor('again', { timeoutMs: 1_000 }) });
    await pass(at(0));
    await pass(at(1_000));
    expect(await runState(run.id)).toBe('failed');
    expect(await retryRun(db.pool, run.id)).toMatchObject({ retried: true });
    expect(await pass(at(2_000))).toMatchObject({ parked: 1 });
    expect(new Date((await stepRow(run.id, 'w')).run_at as string).getTime()).toBe(at(3_000).getTime());
    await signal(db.pool, 'again', 'ok');
    await pass(at(2_500));
    expect(await runState(run.id)).toBe('succeeded');
  });

  it('lets retention delete signals past their keep, and no sooner', async () => {
    await clear();
    await signal(db.pool, 'short', 1, { id: 's', keepMs: 1_000 });
    await signal(db.pool, 'long', 1, { id: 'l' });
    expect(await applyRetention(db.pool)).toMatchObject({ signals: 0 });
    expect(await applyRetention(db.pool, { now: new Date(Date.now() + 60_000) })).toMatchObject({ signals: 1 });
    const left = await db.rows<{ key: string }>('SELECT key FROM outlive.signals');
    expect(left).toEqual([{ key: 'long' }]);
  });

  it('lets a task due behind a storm of deadlines start before the storm is over', async () => {
    await clear();
    for (let i = 0; i < 300; i += 100) {
      await db.pool.query('BEGIN');
      for (let j = i; j < i + 100; j++) await startRun(db.pool, 'storm', { w: waitFor(`storm:${j}`, { onTimeout: { value: null } }) });
      await db.pool.query('COMMIT');
    }
    expect(await pass(at(0), { concurrency: 50 })).toMatchObject({ parked: 300 });
    // Every deadline at one instant, before the plain task was enqueued: the claim's order puts them all first.
    await db.pool.query(`UPDATE outlive.tasks SET run_at = now() - interval '1 second', wait_until = now() - interval '1 second' WHERE name = '$wait'`);
    const plain = defineTask({ name: 'plain', input: z.object({}), run: () => 'ran' });
    const { id } = await enqueue(db.pool, plain, {});
    const r = await tick(db.pool, { tasks: [plain], concurrency: 2 });
    expect(r).toMatchObject({ claimed: 1, succeeded: 301 });
    const [order] = await db.rows<{ before: number }>(
      `SELECT count(*)::int AS before FROM outlive.tasks w, outlive.tasks p WHERE w.name = '$wait' AND p.id = $1 AND w.started_at < p.started_at`,
      [id],
    );
    // Claimed after a batch or two of waits, not after all 300.
    expect(order!.before).toBeLessThan(100);
  });

  it('refuses bad keys and options before anything is written', async () => {
    expect(() => waitFor('')).toThrow(InvalidGraphError);
    expect(() => waitFor('k', { timeoutMs: -1 })).toThrow(/timeoutMs/);
    expect(() => waitFor('k', { timeout: 5 } as never)).toThrow(/unknown option\(s\) timeout/);
    expect(() => waitFor('k', { onTimeout: 'succeed' } as never)).toThrow(/onTimeout/);
    await expect(signal(db.pool, 'k', 1, { id: '' })).rejects.toThrow(InvalidSignalError);
    await expect(signal(db.pool, 'k', 1, { ttl: 5 } as never)).rejects.toThrow(/unknown option\(s\) ttl/);
    await expect(signal(db.pool, 'k', { big: 'x'.repeat(1_100_000) })).rejects.toThrow(/over the limit/);
    await expect(signal(db.pool, 'k', 1n as never)).rejects.toThrow(/does not serialise/);
  });
});

describe('sleepStep', () => {
  it('sleeps until a time, and for a while from when it begins', async () => {
    await clear();
    const run = await startRun(db.pool, 'sleepy', {
      until: sleepStep({ until: at(5_000) }),
      more: sleepStep({ ms: 20_000 }, { after: ['until'] }),
      done: step(after, {}, { after: ['more'] }),
    });
    expect(await pass(at(0))).toMatchObject({ claimed: 0, parked: 0 });
    expect((await explainRun(db.pool, run.id, { now: at(0) }))!.tasks[0]!.why).toBe(`sleeping until ${at(5_000).toISOString()}`);
    // Due at its time, it ends without parking.
    expect(await pass(at(5_000))).toMatchObject({ succeeded: 1, parked: 1 });
    expect(await stepRow(run.id, 'until')).toMatchObject({ state: 'succeeded', output: null, snoozes: 0 });
    expect(new Date((await stepRow(run.id, 'more')).run_at as string).getTime()).toBe(at(25_000).getTime());
    expect(await pass(at(24_999))).toMatchObject({ claimed: 0, succeeded: 0 });
    await pass(at(25_000));
    expect(await runState(run.id)).toBe('succeeded');
  });

  it('refuses what is not a time', () => {
    expect(() => sleepStep({ ms: 1.5 })).toThrow(InvalidGraphError);
    expect(() => sleepStep({ until: new Date('nope') })).toThrow(InvalidGraphError);
    expect(() => sleepStep({} as never)).toThrow(/until: Date/);
  });
});
