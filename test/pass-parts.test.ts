/**
 * The parts a pass is made of, each on its own: the lease watch and the
 * settler. (The claim loop that joins them is tick.ts, tested in tick.test.ts
 * and through every pass of the suite.)
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask } from '../src/model/task.js';
import { enqueue } from '../src/write/enqueue.js';
import { claim, type ClaimedTask } from '../src/pass/claim.js';
import { toExecutor, type PoolLike } from '../src/db/executor.js';
import { withPreparedStatements } from '../src/db/statements.js';
import { LeaseLostError, LeaseWatch } from '../src/pass/lease-watch.js';
import { Settler, type SettledBatch } from '../src/pass/settler.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
const noop = defineTask({ name: 'part.noop', input: z.object({ n: z.number() }), run: () => null });
const lease = { owner: 'parts', now: null, leaseMs: 30_000, leaseGraceMs: 1_000 };

async function claimed(n: number, owner = lease.owner): Promise<ClaimedTask[]> {
  for (let i = 0; i < n; i++) await enqueue(db.pool, noop, { n: i });
  return claim(toExecutor(withPreparedStatements(db.pool)), { owner, limit: n, maxTimeoutMs: 60_000, queues: null, names: [noop.name], leaseGraceMs: 1_000, leaseMs: 30_000, now: null });
}

/** A pool that counts the statements sent through it, by their first words. */
function counting(): { pool: PoolLike; sent: string[] } {
  const sent: string[] = [];
  const pool = {
    query: (...args: unknown[]) => {
      const text = typeof args[0] === 'string' ? args[0] : (args[0] as { text: string }).text;
      sent.push(text.trim().split(/\s+/).slice(0, 3).join(' '));
      return (db.pool.query as (...a: unknown[]) => Promise<unknown>)(...args);
    },
    connect: () => db.pool.connect(),
  } as unknown as PoolLike;
  return { pool, sent };
}

describe('the lease watch', () => {
  it('looks only at tasks running longer than one interval, holds them through one lease row without writing theirs, and aborts the handler of a row it lost', async () => {
    const [a, b] = await claimed(2);
    const { pool, sent } = counting();
    const watch = new LeaseWatch(toExecutor(pool), lease, 60_000);
    try {
      const abortA = watch.track(a!.id);
      await watch.check();
      // a started less than an interval ago: nothing to extend, nothing sent.
      expect(sent).toEqual([]);
      // With an interval of 1 ms, both are old enough by the next check.
      const short = new LeaseWatch(toExecutor(pool), lease, 1);
      const abortB = short.track(b!.id);
      short.track(a!.id, abortA);
      await new Promise((r) => setTimeout(r, 5));
      await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', lease_owner = NULL WHERE id = $1`, [b!.id]);
      const rowVersion = async () => (await db.rows<{ v: string }>(`SELECT xmin::text AS v FROM outlive.tasks WHERE id = $1`, [a!.id]))[0]!.v;
      const before = await rowVersion();
      await short.check();
      await short.check();
      expect(abortB.aborted).toBe(true);
      expect(abortB.reason).toBeInstanceOf(LeaseLostError);
      expect(abortA.aborted).toBe(false);
      // The pass's lease: leaseMs plus the grace from now, written once for both checks.
      const [row] = await db.rows<{ later: boolean }>(`SELECT expires_at > now() + interval '25 seconds' AS later FROM outlive.leases WHERE owner = $1`, [lease.owner]);
      expect(row!.later).toBe(true);
      expect(sent.filter((s) => s.startsWith('INSERT INTO outlive.leases'))).toHaveLength(1);
      // a's row itself was not written.
      expect(await rowVersion()).toBe(before);
      await short.stop();
      // A pass that ends lets its lease go.
      expect(await db.rows(`SELECT 1 FROM outlive.leases WHERE owner = $1`, [lease.owner])).toEqual([]);
    } finally {
      await watch.stop();
    }
  });

  it('ctx.heartbeat() renews the pass lease at most once a check interval and says whether the row is still held', async () => {
    const [c] = await claimed(1, 'beating');
    const { pool, sent } = counting();
    const watch = new LeaseWatch(toExecutor(pool), { ...lease, owner: 'beating' }, 60_000);
    try {
      const abort = watch.track(c!.id);
      const row = { ...c! };
      for (let i = 0; i < 5; i++) expect(await watch.heartbeat(row, abort)).toBe(true);
      expect(sent.filter((s) => s.startsWith('INSERT INTO outlive.leases'))).toHaveLength(1);
      await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', lease_owner = NULL WHERE id = $1`, [c!.id]);
      expect(await watch.heartbeat(row, abort)).toBe(false);
      expect(abort.reason).toBeInstanceOf(LeaseLostError);
    } finally {
      await watch.stop();
    }
  });
});

describe('the settler', () => {
  it('settles what finished in one turn together, then what finished while that settle was in flight, and counts what landed', async () => {
    const rows = await claimed(7, 'settler');
    const batches: SettledBatch[] = [];
    const errors: unknown[] = [];
    const { pool, sent } = counting();
    const settler = new Settler(pool, 'settler', null, (b) => batches.push(b), (e) => errors.push(e));
    const push = (r: ClaimedTask) => settler.push({ id: r.id, runId: null, attempt: r.attempts, state: 'succeeded', output: null });
    rows.slice(0, 5).forEach(push);
    expect(settler.unsettled).toBe(5);
    // Nothing is sent in the turn the outcomes arrive in.
    expect(sent).toEqual([]);
    // The settler's timer comes first: its settle of the five is in flight when these two arrive.
    await new Promise((r) => setTimeout(r, 0));
    expect(sent).toHaveLength(1);
    rows.slice(5).forEach(push);
    await settler.flush();
    expect(settler.unsettled).toBe(0);
    expect(sent).toHaveLength(2);
    expect(batches.map((b) => [b.size, b.rows.length, b.kept])).toEqual([[5, 5, 0], [2, 2, 0]]);
    expect(errors).toEqual([]);
  });

  it('settles at once when asked to flush, without waiting for the turn to end', async () => {
    const rows = await claimed(3, 'settler-now');
    const batches: SettledBatch[] = [];
    const settler = new Settler(db.pool, 'settler-now', null, (b) => batches.push(b), () => undefined);
    for (const r of rows) settler.push({ id: r.id, runId: null, attempt: r.attempts, state: 'succeeded', output: null });
    await settler.flush();
    expect(batches.map((b) => b.size)).toEqual([3]);
    // The timer the pushes set was cleared: nothing settles again.
    await new Promise((r) => setTimeout(r, 5));
    expect(batches).toHaveLength(1);
  });

  it('reports a lost lease as an outcome that matched no row', async () => {
    const [r] = await claimed(1, 'settler-lost');
    const batches: SettledBatch[] = [];
    const settler = new Settler(db.pool, 'someone-else', null, (b) => batches.push(b), () => undefined);
    settler.push({ id: r!.id, runId: null, attempt: r!.attempts, state: 'succeeded', output: null });
    await settler.flush();
    expect(batches).toEqual([{ rows: [], size: 1, kept: 0, freedSlots: false }]);
  });
});
