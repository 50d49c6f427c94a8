import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, recover, startRun, step, tick } from '../src/index.js';
import { RECOVER_SQL } from '../src/pass/recover.js';
import { SETTLE_SQL } from '../src/pass/settle.js';
import { freshDb } from './support/db.js';
import { taskRow } from './support/tasks.js';

const db = await freshDb();
const T0 = new Date('2026-05-01T08:00:00Z');
const at = (ms: number) => new Date(T0.getTime() + ms);

async function clear() {
  await db.pool.query('DELETE FROM outlive.tasks');
}

/** A task whose handler waits until the test lets it go. */
function gatedTask(name: string) {
  const gates: Array<() => void> = [];
  const started: string[] = [];
  const task = defineTask({
    name,
    input: z.object({}),
    timeoutMs: 10_000,
    run: async (_i, ctx) => {
      started.push(`${ctx.taskId}#${ctx.attempt}`);
      await new Promise<void>((resolve) => gates.push(resolve));
      return { attempt: ctx.attempt };
    },
  });
  const untilStarted = async (n: number) => {
    while (started.length < n) await new Promise((r) => setTimeout(r, 5));
  };
  return { task, gates, started, untilStarted };
}

describe('recover', () => {
  it('hands back a task whose lease expired without spending one of its attempts', async () => {
    await clear();
    const t = defineTask({ name: 'r', input: z.object({}), timeoutMs: 1_000, retry: { maxAttempts: 3 }, run: () => 'done' });
    const { id } = await enqueue(db.pool, t, {});
    // A pass that died: the row is running under a lease that nobody will settle.
    await db.pool.query(
      `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = $2 WHERE id = $1`,
      [id, at(0)],
    );
    expect((await recover(db.pool, { now: at(-1) })).rows).toHaveLength(0); // not expired yet
    const r = await recover(db.pool, { now: at(1) });
    expect(r).toMatchObject({ retried: 1, failed: 0 });
    const row = await taskRow(db.pool, id);
    // Attempt 1 was the pass's fault: the task still has its 3 (attempts 2 to 4).
    expect(row).toMatchObject({ state: 'pending', lease_owner: null, attempts: 1, max_attempts: 4, interruptions: 1 });
    expect(row.errors[0]).toMatchObject({ attempt: 1, name: 'LeaseExpired' });
    expect(row.errors[0].message).toMatch(/interruption 1 of 20, not counted as an attempt/);
    expect(new Date(row.run_at).getTime()).toBe(at(1 + 1_000).getTime());
    // The next pass runs it.
    const report = await tick(db.pool, { tasks: [t], now: at(5_000) });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', attempts: 2 });
  });

  /** As a pass that claims the task and dies before settling it, then recovery `ms` later. */
  async function interrupt(id: string, ms: number) {
    await db.pool.query(
      `UPDATE outlive.tasks SET state = 'running', attempts = attempts + 1, lease_owner = 'dead', lease_expires_at = $2 WHERE id = $1 AND state = 'pending'`,
      [id, at(ms)],
    );
    return recover(db.pool, { now: at(ms + 1) });
  }

  it('faults alone never fail a task: after many interruptions its handler still has every attempt it declared', async () => {
    await clear();
    let calls = 0;
    const t = defineTask({
      name: 'flaky-once',
      input: z.object({}),
      retry: { maxAttempts: 2, backoff: { baseMs: 1 } },
      run: () => {
        if (++calls === 1) throw new Error('the handler failed once');
        return 'done';
      },
    });
    const { id } = await enqueue(db.pool, t, {});
    for (let i = 0; i < 5; i++) expect(await interrupt(id, i * 10_000_000)).toMatchObject({ retried: 1, failed: 0 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'pending', attempts: 5, max_attempts: 7, interruptions: 5 });
    // The handler fails once (one of its 2) and then succeeds.
    expect(await tick(db.pool, { tasks: [t], now: at(100_000_000) })).toMatchObject({ claimed: 1, retried: 1 });
    expect(await tick(db.pool, { tasks: [t], now: at(100_010_000) })).toMatchObject({ claimed: 1, succeeded: 1 });
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', attempts: 7, interruptions: 5 });
  });

  it('a task whose every attempt is cut short still ends: failed after 20 interruptions, with that reason; a retry starts it afresh', async () => {
    await clear();
    const t = defineTask({ name: 'killer', input: z.object({}), retry: { maxAttempts: 3 }, run: () => 'never settles here' });
    const { id } = await enqueue(db.pool, t, {});
    for (let i = 0; i < 20; i++) expect(await interrupt(id, i * 10_000_000)).toMatchObject({ retried: 1, failed: 0 });
    expect(await interrupt(id, 20 * 10_000_000)).toMatchObject({ retried: 0, failed: 1 });
    const row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'failed', attempts: 21, max_attempts: 23, interruptions: 20 });
    expect(row.last_error).toBe('lease expired: the pass running attempt 21 stopped before settling it (interrupted 21 times, more than 20)');
    const { getTask } = await import('../src/admin/queries.js');
    expect(await getTask(db.pool, id)).toMatchObject({ attempts: 21, maxAttempts: 23, interruptions: 20 });
    const { retryTask } = await import('../src/index.js');
    await retryTask(db.pool, id);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'pending', attempts: 0, max_attempts: 3, interruptions: 0 });
  });

  it('refuses a row whose interruptions would leave it no attempt of its own', async () => {
    await clear();
    const t = defineTask({ name: 'checked', input: z.object({}), retry: { maxAttempts: 2 }, run: () => 'done' });
    const { id } = await enqueue(db.pool, t, {});
    await expect(db.pool.query(`UPDATE outlive.tasks SET interruptions = -1 WHERE id = $1`, [id])).rejects.toThrow(/tasks_unspent_attempts_check/);
    await expect(db.pool.query(`UPDATE outlive.tasks SET interruptions = 2 WHERE id = $1`, [id])).rejects.toThrow(/tasks_unspent_attempts_check/);
  });

  it('fails a recovered task that has no attempts left', async () => {
    await clear();
    const t = defineTask({ name: 'r1', input: z.object({}), retry: { maxAttempts: 1 }, run: () => 'done' });
    const { id } = await enqueue(db.pool, t, {});
    await db.pool.query(
      `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = $2 WHERE id = $1`,
      [id, at(0)],
    );
    const report = await tick(db.pool, { tasks: [t], now: at(1) });
    expect(report.recovered).toBe(1);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'failed', attempts: 1 });
  });

  it('runs beside the pass’s first claim: a task ready now starts while recovery waits on a lock', async () => {
    await clear();
    // A run whose only step died with no attempts left: recovering it fails the
    // step and then its run, and the test holds the run's row locked.
    const doomed = defineTask({ name: 'doomed', input: z.object({}), retry: { maxAttempts: 1 }, run: () => 'never' });
    const run = await startRun(db.pool, 'locked-run', { only: step(doomed, {}) });
    await db.pool.query(`UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead', lease_expires_at = $2 WHERE id = $1`, [
      run.tasks.only,
      at(0),
    ]);
    const g = gatedTask('ready-now');
    const { id } = await enqueue(db.pool, g.task, {}, { runAt: T0 });
    const locker = await db.pool.connect();
    try {
      await locker.query('BEGIN');
      await locker.query('SELECT 1 FROM outlive.runs WHERE id = $1 FOR UPDATE', [run.id]);
      const pass = tick(db.pool, { tasks: [g.task, doomed], now: at(1) });
      // Recovery cannot commit while the run's row is locked; the ready task
      // starts anyway. (Run before the claim, recovery held it back: this wait
      // would end on its 5 s bound with nothing started.)
      const bound = Date.now() + 5_000;
      while (g.started.length === 0 && Date.now() < bound) await new Promise((r) => setTimeout(r, 5));
      expect(g.started).toEqual([`${id}#1`]);
      expect((await db.pool.query(`SELECT state FROM outlive.tasks WHERE id = $1`, [run.tasks.only])).rows[0].state).toBe('running');
      await locker.query('COMMIT');
      g.gates.forEach((open) => open());
      const report = await pass;
      expect(report).toMatchObject({ claimed: 1, succeeded: 1, recovered: 1 });
    } finally {
      await locker.query('ROLLBACK').catch(() => undefined);
      locker.release();
    }
    expect(await taskRow(db.pool, run.tasks.only!)).toMatchObject({ state: 'failed' });
    expect((await db.pool.query(`SELECT state FROM outlive.runs WHERE id = $1`, [run.id])).rows[0].state).toBe('failed');
  });

  it('drops a late settle after the lease was lost: the later attempt’s result stands', async () => {
    await clear();
    const g = gatedTask('slow');
    const { id } = await enqueue(db.pool, g.task, {}, { runAt: T0 });
    const first = tick(db.pool, { tasks: [g.task], now: T0, recover: false });
    await g.untilStarted(1);
    // Its lease (10 s timeout + 5 s grace) expires; recovery hands the row back.
    expect((await recover(db.pool, { now: at(16_000) })).retried).toBe(1);
    // A second pass claims and finishes attempt 2.
    const second = tick(db.pool, { tasks: [g.task], now: at(20_000), recover: false });
    await g.untilStarted(2);
    g.gates[1]!();
    expect(await second).toMatchObject({ succeeded: 1, lostLeases: 0 });
    // Now the first handler finishes late: its settle must match nothing.
    g.gates[0]!();
    expect(await first).toMatchObject({ succeeded: 0, lostLeases: 1 });
    const row = await taskRow(db.pool, id);
    expect(row).toMatchObject({ state: 'succeeded', attempts: 2, output: { attempt: 2 } });
  });

  it('a completion that commits first is never overwritten by a racing recovery', async () => {
    await clear();
    const t = defineTask({ name: 'race', input: z.object({}), run: () => 1 });
    const { id } = await enqueue(db.pool, t, {});
    await db.pool.query(
      `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'me', lease_expires_at = $2 WHERE id = $1`,
      [id, at(0)],
    );
    // The completion holds its row lock, uncommitted...
    const completer = await db.pool.connect();
    await completer.query('BEGIN');
    const settled = await completer.query(SETTLE_SQL, [at(1), [id], ['succeeded'], ['{"ok":true}'], [null], [0], [null], 'me', [1]]);
    expect(settled.rows).toHaveLength(1);
    // ...while recovery runs: it skips the locked row instead of waiting or overwriting.
    expect((await db.pool.query(RECOVER_SQL, [at(10), 100, 20])).rows).toHaveLength(0);
    await completer.query('COMMIT');
    completer.release();
    // And after the commit, the row no longer matches recovery at all.
    expect((await db.pool.query(RECOVER_SQL, [at(10), 100, 20])).rows).toHaveLength(0);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', output: { ok: true } });
  });

  it('a recovery that commits first makes the racing completion change nothing', async () => {
    await clear();
    const t = defineTask({ name: 'race2', input: z.object({}), run: () => 1 });
    const { id } = await enqueue(db.pool, t, {});
    await db.pool.query(
      `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'me', lease_expires_at = $2 WHERE id = $1`,
      [id, at(0)],
    );
    const recoverer = await db.pool.connect();
    await recoverer.query('BEGIN');
    expect((await recoverer.query(RECOVER_SQL, [at(10), 100, 20])).rows).toHaveLength(1);
    // The completion waits on recovery's row lock, then rechecks its guard.
    const settling = db.pool.query(SETTLE_SQL, [at(11), [id], ['succeeded'], ['{"ok":true}'], [null], [0], [null], 'me', [1]]);
    await new Promise((r) => setTimeout(r, 50));
    await recoverer.query('COMMIT');
    recoverer.release();
    expect((await settling).rows).toHaveLength(0);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'pending', output: null, lease_owner: null });
  });
});

describe('the time budget', () => {
  it('a pass with a short budget returns in time and leaves unclaimed work pending, never half-claimed', async () => {
    await clear();
    const slow = defineTask({
      name: 'slow-200',
      input: z.object({ i: z.number() }),
      timeoutMs: 300,
      run: () => new Promise((r) => setTimeout(() => r('ok'), 150)),
    });
    for (let i = 0; i < 30; i++) await enqueue(db.pool, slow, { i });
    const report = await tick(db.pool, { tasks: [slow], concurrency: 2, budgetMs: 1_000, reserveMs: 100 });
    // 'drained' here means no ready task's timeout fitted in what was left.
    expect(['budget', 'drained']).toContain(report.stoppedBy);
    expect(report.claimed).toBeGreaterThan(0);
    expect(report.claimed).toBeLessThan(30);
    expect(report.succeeded).toBe(report.claimed);
    // Loose bound: the budget plus one settle, never the 30 x 150 ms a full drain takes.
    expect(report.durationMs).toBeLessThan(1_000 + 500);
    const states = await db.rows<{ state: string; n: number }>(`SELECT state::text, count(*)::int n FROM outlive.tasks GROUP BY 1 ORDER BY 1`);
    expect(states).toEqual([
      { state: 'pending', n: 30 - report.claimed },
      { state: 'succeeded', n: report.claimed },
    ]);
    expect(await db.rows(`SELECT 1 FROM outlive.tasks WHERE state = 'pending' AND (attempts > 0 OR lease_owner IS NOT NULL)`)).toHaveLength(0);
  });

  it('does not claim a task whose timeout does not fit in the budget', async () => {
    await clear();
    const long = defineTask({ name: 'long', input: z.object({}), timeoutMs: 60_000, run: () => 1 });
    const short = defineTask({ name: 'short', input: z.object({}), timeoutMs: 1_000, run: () => 1 });
    const l = await enqueue(db.pool, long, {});
    const s = await enqueue(db.pool, short, {});
    const report = await tick(db.pool, { tasks: [long, short], budgetMs: 20_000 });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1 });
    expect((await taskRow(db.pool, l.id)).state).toBe('pending');
    expect((await taskRow(db.pool, s.id)).state).toBe('succeeded');
  });

  it('stops claiming at maxTasks and when its signal aborts', async () => {
    await clear();
    const t = defineTask({ name: 'm', input: z.object({ i: z.number() }), run: () => 1 });
    for (let i = 0; i < 10; i++) await enqueue(db.pool, t, { i });
    expect(await tick(db.pool, { tasks: [t], maxTasks: 4, concurrency: 2 })).toMatchObject({ claimed: 4, stoppedBy: 'maxTasks' });
    const controller = new AbortController();
    controller.abort();
    expect(await tick(db.pool, { tasks: [t], signal: controller.signal })).toMatchObject({ claimed: 0, stoppedBy: 'signal' });
  });
});

describe('heartbeats', () => {
  it('keeps a slow task alive past its short lease while its pass runs; a dead pass’s task is recovered within one lease', async () => {
    await clear();
    let beats = 0;
    const slow = defineTask({
      name: 'slow-heart',
      input: z.object({}),
      timeoutMs: 60_000,
      run: async (_i, ctx) => {
        for (let i = 0; i < 6; i++) {
          await new Promise((r) => setTimeout(r, 100));
          if (await ctx.heartbeat()) beats++;
        }
        return 'alive';
      },
    });
    const { id } = await enqueue(db.pool, slow, {});
    // Leases of 200 ms + 100 ms grace, beaten every 50 ms: far shorter than the task.
    const pass = tick(db.pool, { tasks: [slow], budgetMs: 120_000, leaseMs: 200, leaseGraceMs: 100, leaseCheckMs: 50 });
    let recoveredWhileAlive = 0;
    for (let i = 0; i < 8; i++) {
      await new Promise((r) => setTimeout(r, 80));
      recoveredWhileAlive += (await recover(db.pool)).rows.length;
    }
    expect(await pass).toMatchObject({ succeeded: 1, lostLeases: 0 });
    expect(recoveredWhileAlive).toBe(0);
    expect(beats).toBe(6);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'succeeded', attempts: 1 });

    // A pass that dies leaves a lease of leaseMs + grace, not of the task's 60 s timeout.
    const { id: orphan } = await enqueue(db.pool, slow, {});
    const { claim } = await import('../src/pass/claim.js');
    const { toExecutor } = await import('../src/db/executor.js');
    const { withPreparedStatements } = await import('../src/db/statements.js');
    const t1 = new Date(Date.now() + 60_000);
    const later = (ms: number) => new Date(t1.getTime() + ms);
    expect(await claim(toExecutor(withPreparedStatements(db.pool)), { owner: 'dead', limit: 1, maxTimeoutMs: 120_000, queues: null, names: [slow.name], leaseGraceMs: 100, leaseMs: 200, now: t1 })).toHaveLength(1);
    expect((await recover(db.pool, { now: later(250) })).rows).toHaveLength(0);
    expect((await recover(db.pool, { now: later(301) })).rows.map((r) => r.id)).toEqual([orphan]);
  });
});

describe('pass leases', () => {
  it('hold a pass’s long tasks through one row: their own rows are not rewritten while they wait, and none is recovered', async () => {
    await clear();
    const wait = defineTask({ name: 'long-wait', input: z.object({ i: z.number() }), timeoutMs: 60_000, run: () => new Promise((r) => setTimeout(() => r('done'), 1_200)) });
    for (let i = 0; i < 20; i++) await enqueue(db.pool, wait, { i });
    // Claim-time leases of 200 ms + 100 ms grace, checks every 50 ms: the rows' own leases expire at once.
    const pass = tick(db.pool, { tasks: [wait], budgetMs: 120_000, concurrency: 20, leaseMs: 200, leaseGraceMs: 100, leaseCheckMs: 50 });
    const versions = async () => (await db.rows<{ v: string }>(`SELECT xmin::text || ':' || id AS v FROM outlive.tasks WHERE state = 'running' ORDER BY id`)).map((r) => r.v);
    await new Promise((r) => setTimeout(r, 300));
    const before = await versions();
    expect(before).toHaveLength(20);
    let recovered = 0;
    for (let i = 0; i < 6; i++) {
      await new Promise((r) => setTimeout(r, 100));
      recovered += (await recover(db.pool)).rows.length;
    }
    expect(await versions()).toEqual(before);
    expect(await db.rows(`SELECT owner FROM outlive.leases`)).toHaveLength(1);
    expect(recovered).toBe(0);
    expect(await pass).toMatchObject({ succeeded: 20, lostLeases: 0 });
    // The pass let its lease go.
    expect(await db.rows(`SELECT owner FROM outlive.leases`)).toEqual([]);
  });

  it('recover the tasks of a pass whose lease expired, and delete the expired lease', async () => {
    await clear();
    const wait = defineTask({ name: 'orphaned', input: z.object({}), timeoutMs: 60_000, run: () => 'never' });
    const { id } = await enqueue(db.pool, wait, {});
    const t1 = new Date(Date.now() + 60_000);
    const later = (ms: number) => new Date(t1.getTime() + ms);
    const { claim } = await import('../src/pass/claim.js');
    const { toExecutor } = await import('../src/db/executor.js');
    const { withPreparedStatements } = await import('../src/db/statements.js');
    expect(await claim(toExecutor(withPreparedStatements(db.pool)), { owner: 'died', limit: 1, maxTimeoutMs: 120_000, queues: null, names: [wait.name], leaseGraceMs: 100, leaseMs: 200, now: t1 })).toHaveLength(1);
    // Its pass had renewed its lease to t1 + 1 s before it died.
    await db.pool.query(`INSERT INTO outlive.leases (owner, expires_at) VALUES ('died', $1)`, [later(1_000)]);
    // An operator is shown the later of the row's own lease (t1 + 300 ms) and its pass's.
    const { getTask } = await import('../src/admin/queries.js');
    expect((await getTask(db.pool, id))?.leaseExpiresAt).toEqual(later(1_000));
    expect((await recover(db.pool, { now: later(500) })).rows).toHaveLength(0);
    expect((await recover(db.pool, { now: later(1_001) })).rows.map((r) => r.id)).toEqual([id]);
    expect(await db.rows(`SELECT owner FROM outlive.leases`)).toEqual([]);
    expect(await taskRow(db.pool, id)).toMatchObject({ state: 'pending', attempts: 1, lease_owner: null });
  });
});
