import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, defineSchedule, defineTask, enqueueDue, ScheduleError, tick, type AnySchedule } from '../src/index.js';
import { closePool, freshDb } from './support/db.js';

const db = await freshDb();

const ping = defineTask({
  name: 'ping',
  input: z.object({ n: z.number().int() }),
  run: ({ n }) => ({ n }),
});

const stamp = defineTask({
  name: 'stamp',
  input: z.object({ slot: z.string() }),
  run: ({ slot }) => ({ slot }),
});

const at = (iso: string) => new Date(iso);

/** A schedule under a name of its own per test, so tests do not share rows. */
function every15(name: string, extra: Partial<Parameters<typeof defineSchedule<typeof ping>>[0]> = {}) {
  return defineSchedule({ name, cron: '*/15 * * * *', task: ping, input: { n: 1 }, ...extra });
}

async function tasksOf(name: string) {
  return db.rows<{ id: string; run_at: Date; input: unknown; name: string }>(
    `SELECT t.id::text, t.run_at, t.input, t.name FROM outlive.tasks t
     JOIN outlive.schedule_slots s ON s.task_id = t.id WHERE s.schedule = $1 ORDER BY t.run_at`,
    [name],
  );
}

async function scheduleRow(name: string) {
  const [row] = await db.rows<{ cron: string; timezone: string; task: string; next_slot: Date; last_slot: Date | null; last_fired_at: Date | null }>(
    `SELECT cron, timezone, task, next_slot, last_slot, last_fired_at FROM outlive.schedules WHERE name = $1`,
    [name],
  );
  return row;
}

// Every enqueueDue call passes the full list of the schedules it knows; the
// tests use prune: false so that each one's schedules leave the others' alone,
// except the test of removal itself.
const keep = { prune: false };

describe('defineSchedule', () => {
  it('checks the cron, the time zone, the input and the policy when the schedule is defined', () => {
    expect(() => every15('bad-cron', { cron: '61 * * * *' })).toThrow(/schedule "bad-cron": cannot read cron "61 \* \* \* \*"/);
    expect(() => every15('bad-tz', { timezone: 'Mars/Olympus' })).toThrow(/schedule "bad-tz": cannot read cron .* in time zone "Mars\/Olympus"/);
    expect(() => every15('bad-input', { input: { n: 1.5 } as never })).toThrow(/schedule "bad-input": input does not match the schema of task "ping": n:/);
    expect(() => every15('bad-policy', { missed: { catchUp: 0 } })).toThrow(ConfigError);
    expect(() => every15('bad name!')).toThrow(/schedule name "bad name!" is invalid/);
    expect(() => every15('run-at', { enqueue: { runAt: new Date() } as never })).toThrow(/runAt is always the slot time/);
  });

  it('refuses two different schedules under one name', async () => {
    await expect(enqueueDue(db.pool, [every15('twin'), every15('twin')], keep)).rejects.toThrow(/two schedules are named "twin"/);
  });
});

describe('enqueueDue', () => {
  it('starts a new schedule at its first slot after the tick that sees it, then fires each slot once', async () => {
    const s = every15('first-sight');
    const seen = await enqueueDue(db.pool, [s], { now: at('2025-01-01T10:07:00Z'), ...keep });
    expect(seen).toMatchObject({ added: ['first-sight'], enqueued: [], nextSlot: at('2025-01-01T10:15:00Z') });
    expect(await scheduleRow('first-sight')).toMatchObject({ cron: '*/15 * * * *', timezone: 'UTC', task: 'ping', next_slot: at('2025-01-01T10:15:00Z'), last_slot: null });

    // A slot is due at its own instant.
    const fired = await enqueueDue(db.pool, [s], { now: at('2025-01-01T10:15:00Z'), ...keep });
    expect(fired.enqueued.map((e) => e.slot)).toEqual([at('2025-01-01T10:15:00Z')]);
    expect(fired.nextSlot).toEqual(at('2025-01-01T10:30:00Z'));
    const [task] = await tasksOf('first-sight');
    expect(task).toMatchObject({ id: fired.enqueued[0]!.taskId, name: 'ping', run_at: at('2025-01-01T10:15:00Z'), input: { n: 1 } });
    expect(await scheduleRow('first-sight')).toMatchObject({
      last_slot: at('2025-01-01T10:15:00Z'),
      last_fired_at: at('2025-01-01T10:15:00Z'),
      next_slot: at('2025-01-01T10:30:00Z'),
    });

    // Repeated and retried ticks of the same minute do nothing more.
    for (const now of ['2025-01-01T10:15:00Z', '2025-01-01T10:15:30Z', '2025-01-01T10:29:59.999Z']) {
      expect((await enqueueDue(db.pool, [s], { now: at(now), ...keep })).enqueued).toEqual([]);
    }
    expect(await tasksOf('first-sight')).toHaveLength(1);
  });

  it('yields exactly one task per slot when 5 connections tick the same slot at once', async () => {
    const s = every15('contended');
    await enqueueDue(db.pool, [s], { now: at('2025-02-01T09:59:00Z'), ...keep });
    const pools = Array.from({ length: 5 }, () => db.newPool({ max: 1 }));
    try {
      for (const slot of ['2025-02-01T10:00:00Z', '2025-02-01T10:15:00Z', '2025-02-01T10:30:00Z']) {
        // Each connection ticks at a slightly different moment of the same slot.
        const reports = await Promise.all(
          pools.map((p, i) => enqueueDue(p, [s], { now: new Date(at(slot).getTime() + i * 250), ...keep })),
        );
        expect(reports.flatMap((r) => r.enqueued)).toHaveLength(1);
      }
    } finally {
      await Promise.all(pools.map(closePool));
    }
    const tasks = await tasksOf('contended');
    expect(tasks.map((t) => t.run_at)).toEqual([at('2025-02-01T10:00:00Z'), at('2025-02-01T10:15:00Z'), at('2025-02-01T10:30:00Z')]);
    const counted = await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks t WHERE t.id IN (SELECT task_id FROM outlive.schedule_slots WHERE schedule = 'contended')`);
    expect(counted).toEqual([{ n: 3 }]);
  });

  it('lets the slot key, not the schedule row, decide: a tick that sees a slot again enqueues nothing', async () => {
    const s = every15('replayed');
    await enqueueDue(db.pool, [s], { now: at('2025-03-01T09:50:00Z'), ...keep });
    const first = await enqueueDue(db.pool, [s], { now: at('2025-03-01T10:00:10Z'), ...keep });
    expect(first.enqueued).toHaveLength(1);
    // As if the row had been restored from before the tick, or a tick read it stale.
    await db.pool.query(`UPDATE outlive.schedules SET next_slot = $2 WHERE name = $1`, ['replayed', at('2025-03-01T10:00:00Z')]);
    const again = await enqueueDue(db.pool, [s], { now: at('2025-03-01T10:00:20Z'), ...keep });
    expect(again.enqueued).toEqual([]);
    expect(await tasksOf('replayed')).toHaveLength(1);
    expect((await scheduleRow('replayed'))!.next_slot).toEqual(at('2025-03-01T10:15:00Z'));
  });

  it('runs only the latest missed slot by default, and skips the rest', async () => {
    const s = every15('missed-latest');
    await enqueueDue(db.pool, [s], { now: at('2025-04-01T00:00:30Z'), ...keep });
    // Down from 00:00:30 to 02:05: slots 00:15 ... 02:00 (eight) were missed.
    const r = await enqueueDue(db.pool, [s], { now: at('2025-04-01T02:05:00Z'), ...keep });
    expect(r.enqueued.map((e) => e.slot)).toEqual([at('2025-04-01T02:00:00Z')]);
    expect(r.skipped).toBe(7);
    expect((await scheduleRow('missed-latest'))!.next_slot).toEqual(at('2025-04-01T02:15:00Z'));
  });

  it('catches up the latest n missed slots, oldest first, when asked', async () => {
    const three = every15('missed-three', { missed: { catchUp: 3 } });
    const all = every15('missed-all', { missed: { catchUp: 100 } });
    await enqueueDue(db.pool, [three, all], { now: at('2025-04-02T00:00:30Z'), ...keep });
    const r = await enqueueDue(db.pool, [three, all], { now: at('2025-04-02T02:05:00Z'), ...keep });
    expect(r.enqueued.filter((e) => e.schedule === 'missed-three').map((e) => e.slot.toISOString())).toEqual([
      '2025-04-02T01:30:00.000Z',
      '2025-04-02T01:45:00.000Z',
      '2025-04-02T02:00:00.000Z',
    ]);
    expect(r.enqueued.filter((e) => e.schedule === 'missed-all')).toHaveLength(8);
    expect(r.skipped).toBe(5);
    expect(await tasksOf('missed-all')).toHaveLength(8);
  });

  it('reads the cron in the schedule time zone, across a daylight-saving change', async () => {
    const berlin = defineSchedule({ name: 'berlin-3am', cron: '0 3 * * *', timezone: 'Europe/Berlin', task: ping, input: { n: 3 } });
    await enqueueDue(db.pool, [berlin], { now: at('2025-03-29T12:00:00Z'), ...keep });
    const winter = await enqueueDue(db.pool, [berlin], { now: at('2025-03-30T00:00:00Z'), ...keep });
    expect(winter.nextSlot).toEqual(at('2025-03-30T01:00:00Z')); // 03:00 CEST, the night the clocks go forward
    const fired = await enqueueDue(db.pool, [berlin], { now: at('2025-03-30T01:00:05Z'), ...keep });
    expect(fired.enqueued.map((e) => e.slot)).toEqual([at('2025-03-30T01:00:00Z')]);
  });

  it('gives the input function its slot time', async () => {
    const s = defineSchedule({ name: 'slot-input', cron: '0 * * * *', task: stamp, input: (slot) => ({ slot: slot.toISOString() }) });
    await enqueueDue(db.pool, [s], { now: at('2025-05-01T07:30:00Z'), ...keep });
    await enqueueDue(db.pool, [s], { now: at('2025-05-01T08:00:01Z'), ...keep });
    const [task] = await tasksOf('slot-input');
    expect(task!.input).toEqual({ slot: '2025-05-01T08:00:00.000Z' });
  });

  it('fires the other schedules when one fails, names the failing one, and fires it once fixed', async () => {
    const good = every15('good-neighbour');
    let broken = true;
    const flaky = defineSchedule({
      name: 'flaky-input',
      cron: '*/15 * * * *',
      task: ping,
      input: () => {
        if (broken) throw new Error('config service down');
        return { n: 2 };
      },
    });
    await enqueueDue(db.pool, [good, flaky], { now: at('2025-06-01T10:01:00Z'), ...keep });
    const failed = enqueueDue(db.pool, [good, flaky], { now: at('2025-06-01T10:15:00Z'), ...keep });
    await expect(failed).rejects.toThrow(ScheduleError);
    const err = (await failed.catch((e: unknown) => e)) as ScheduleError;
    expect(err.message).toMatch(/"flaky-input" \(config service down\)/);
    expect(err.report.enqueued.map((e) => e.schedule)).toEqual(['good-neighbour']);
    // Nothing of the failed slot was written: neither the slot nor a task.
    expect(await tasksOf('flaky-input')).toHaveLength(0);
    expect((await scheduleRow('flaky-input'))!.next_slot).toEqual(at('2025-06-01T10:15:00Z'));
    broken = false;
    const fixed = await enqueueDue(db.pool, [good, flaky], { now: at('2025-06-01T10:16:00Z'), ...keep });
    expect(fixed.enqueued.map((e) => [e.schedule, e.slot.toISOString()])).toEqual([['flaky-input', '2025-06-01T10:15:00.000Z']]);
  });
});

describe('changing the schedules in code', () => {
  it('recomputes the next slot at the next tick when the cron changes', async () => {
    const hourly = defineSchedule({ name: 'changing', cron: '0 * * * *', task: ping, input: { n: 1 } });
    await enqueueDue(db.pool, [hourly], { now: at('2025-07-01T10:07:00Z'), ...keep });
    expect((await scheduleRow('changing'))!.next_slot).toEqual(at('2025-07-01T11:00:00Z'));

    const quarterly = defineSchedule({ name: 'changing', cron: '*/15 * * * *', task: ping, input: { n: 1 } });
    const r = await enqueueDue(db.pool, [quarterly], { now: at('2025-07-01T10:20:00Z'), ...keep });
    expect(r).toMatchObject({ changed: ['changing'], enqueued: [], nextSlot: at('2025-07-01T10:30:00Z') });
    expect(await scheduleRow('changing')).toMatchObject({ cron: '*/15 * * * *', next_slot: at('2025-07-01T10:30:00Z') });
    const fired = await enqueueDue(db.pool, [quarterly], { now: at('2025-07-01T10:30:00Z'), ...keep });
    expect(fired.enqueued.map((e) => e.slot)).toEqual([at('2025-07-01T10:30:00Z')]);

    // A tick still running the old code does not fire the old cron's slots on the new row.
    const stale = await enqueueDue(db.pool, [hourly], { now: at('2025-07-01T11:00:00Z'), ...keep });
    expect(stale).toMatchObject({ changed: ['changing'], enqueued: [] });
  });

  it('keeps the awaited slot when only the task changes', async () => {
    const a = defineSchedule({ name: 'retasked', cron: '0 * * * *', task: ping, input: { n: 1 } });
    await enqueueDue(db.pool, [a], { now: at('2025-07-02T10:07:00Z'), ...keep });
    const b = defineSchedule({ name: 'retasked', cron: '0 * * * *', task: stamp, input: (slot) => ({ slot: slot.toISOString() }) });
    const r = await enqueueDue(db.pool, [b], { now: at('2025-07-02T10:50:00Z'), ...keep });
    expect(r.changed).toEqual(['retasked']);
    expect(await scheduleRow('retasked')).toMatchObject({ task: 'stamp', next_slot: at('2025-07-02T11:00:00Z') });
    await enqueueDue(db.pool, [b], { now: at('2025-07-02T11:00:00Z'), ...keep });
    expect((await tasksOf('retasked')).map((t) => t.name)).toEqual(['stamp']);
  });

  it('removes a schedule that is no longer in the code, so it never fires again', async () => {
    const stays = every15('stays');
    const goes = every15('goes');
    // This test owns the whole list: drop the rows the tests above left.
    await db.pool.query(`DELETE FROM outlive.schedules`);
    await enqueueDue(db.pool, [stays, goes], { now: at('2025-08-01T10:01:00Z') });
    const r = await enqueueDue(db.pool, [stays], { now: at('2025-08-01T10:05:00Z') });
    expect(r.removed).toEqual(['goes']);
    expect(await scheduleRow('goes')).toBeUndefined();
    // An old deployment still ticking with the full list re-adds it from "now", without firing the past.
    const later = await enqueueDue(db.pool, [stays], { now: at('2025-08-01T10:15:00Z') });
    expect(later.enqueued.map((e) => e.schedule)).toEqual(['stays']);
    expect(await tasksOf('goes')).toHaveLength(0);
    const rows = await db.rows<{ name: string }>(`SELECT name FROM outlive.schedules ORDER BY name`);
    expect(rows.map((x) => x.name)).toEqual(['stays']);
  });
});

describe('examples/schedules.ts', async () => {
  // A database of its own: the tick below runs every ready task in it.
  const exampleDb = await freshDb();
  const example = await import('../examples/schedules.js');
  // Closed before its database is dropped.
  const appPool = exampleDb.newPool({ max: 4 });
  example.useAppDb(appPool);

  it('purges files deleted more than 30 days before the nightly slot, and checks every domain', async () => {
    await example.createExampleTables(appPool);
    await appPool.query(`
      INSERT INTO files (name, deleted_at) VALUES
        ('old.pdf', '2025-01-01T00:00:00Z'), ('recent.pdf', '2025-02-01T00:00:00Z'), ('live.pdf', NULL);
      INSERT INTO customer_domains (customer_id, domain, expected_address) VALUES
        (1, 'localhost', '127.0.0.1'), (2, '127.0.0.1', '192.0.2.10');`);
    const schedules: AnySchedule[] = example.schedules;
    await enqueueDue(exampleDb.pool, schedules, { now: at('2025-02-14T12:00:00Z') });
    // 03:00 in Berlin is 02:00 UTC in winter; the DNS check is due at 02:00 too.
    const r = await enqueueDue(exampleDb.pool, schedules, { now: at('2025-02-15T02:00:10Z') });
    expect(r.enqueued.map((e) => [e.schedule, e.slot.toISOString()]).sort()).toEqual([
      ['check-domains-dns', '2025-02-15T02:00:00.000Z'],
      ['purge-deleted-files-nightly', '2025-02-15T02:00:00.000Z'],
    ]);
    const report = await tick(exampleDb.pool, { tasks: example.tasks });
    // The purge, the fan-out, and one check per domain.
    expect(report).toMatchObject({ claimed: 4, succeeded: 4, failed: 0 });
    const files = await appPool.query<{ name: string }>(`SELECT name FROM files ORDER BY name`);
    expect(files.rows.map((f) => f.name)).toEqual(['live.pdf', 'recent.pdf']);
    const domains = await appPool.query(`SELECT domain, dns_ok, dns_error FROM customer_domains ORDER BY id`);
    expect(domains.rows).toEqual([
      { domain: 'localhost', dns_ok: true, dns_error: null },
      { domain: '127.0.0.1', dns_ok: false, dns_error: 'resolves to 127.0.0.1, not 192.0.2.10' },
    ]);
  });
});
