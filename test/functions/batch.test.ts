/**
 * Enqueue inside drizzle neon-http's `db.batch([...])`: the business write
 * and the task row commit together, or not at all, over HTTP. The driver
 * talks Neon's SQL-over-HTTP protocol to a local server of that protocol
 * that runs every statement on the real PostgreSQL (test/support/neon-http.ts).
 */
import { neon, neonConfig } from '@neondatabase/serverless';
import { drizzle } from 'drizzle-orm/neon-http';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { sql } from 'drizzle-orm';
import { pgTable, text, uuid } from 'drizzle-orm/pg-core';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { batchEnqueue, enqueuedFrom } from '../../src/write/batch.js';
import { enqueue, enqueueMany } from '../../src/write/enqueue.js';
import { startRun } from '../../src/write/start-run.js';
import { step } from '../../src/model/step.js';
import { InvalidEnqueueError, OutliveError } from '../../src/model/errors.js';
import { defineTask } from '../../src/model/task.js';
import { tick } from '../../src/pass/tick.js';
import { freshDb } from '../support/db.js';
import { roleUrl, waitFor } from '../support/functions-db.js';
import { createRole } from '../support/roles.js';
import { neonUrl, startNeonHttp } from '../support/neon-http.js';
import { taskRow } from '../support/tasks.js';

const db = await freshDb();
await db.pool.query(`CREATE TABLE signups (id uuid PRIMARY KEY, email text NOT NULL UNIQUE, welcomed boolean NOT NULL DEFAULT false)`);
const { url } = await roleUrl(db); // Neon's proxy requires a password in the URL
// The proxy connects to the compute itself, not through a pooler.
const server = await startNeonHttp(db.directUrl);
afterAll(() => server.close());
neonConfig.fetchEndpoint = server.endpoint;

const signups = pgTable('signups', { id: uuid('id').primaryKey(), email: text('email').notNull() });
// On the endpoint's host name, as Neon hands out the URL (an IP address names no endpoint).
const http = drizzle(neon(neonUrl(url)));

const welcome = defineTask({
  name: 'welcome',
  input: z.object({ signupId: z.string().uuid() }),
  async run({ signupId }) {
    await db.pool.query('UPDATE signups SET welcomed = true WHERE id = $1', [signupId]);
    return { welcomed: signupId };
  },
});

async function count(text: string, params: unknown[] = []): Promise<number> {
  return (await db.rows<{ n: number }>(text, params))[0]!.n;
}

/** Waits until a session of the test database waits for a lock (the batch, for the open transaction's row). */
async function waitForLockWait(): Promise<void> {
  await waitFor(async () => (await count(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)) > 0, 10_000, 'the batch to wait');
}

describe('batchEnqueue in a neon-http db.batch', () => {
  it('commits the business write and the task row in one transaction, then a pass runs the task', async () => {
    const id = crypto.randomUUID();
    const before = server.requests;
    const [inserted, queued] = await http.batch([
      http.insert(signups).values({ id, email: 'ada@example.com' }).returning({ id: signups.id }),
      batchEnqueue(http, welcome, { signupId: id }, { priority: 3 }),
    ]);
    expect(server.requests - before).toBe(1); // one HTTP round trip for both
    expect(inserted).toEqual([{ id }]);
    const task = enqueuedFrom(welcome, queued);
    expect(task).toMatchObject({ name: 'welcome', queue: 'default', state: 'pending', deduplicated: false });
    expect(task.runAt).toBeInstanceOf(Date);
    expect(Number.isNaN(task.runAt.getTime())).toBe(false);
    const row = await taskRow(db.pool, task.id);
    expect(row).toMatchObject({ name: 'welcome', state: 'pending', priority: 3, input: { signupId: id }, max_attempts: 5, timeout_ms: 15_000 });
    expect(row.run_at.getTime()).toBe(task.runAt.getTime());

    const report = await tick(db.pool, { tasks: [welcome] });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1 });
    expect(await count(`SELECT count(*)::int AS n FROM signups WHERE id = $1 AND welcomed`, [id])).toBe(1);
  });

  it('rolls the task row back with the batch when a later statement fails', async () => {
    const taken = crypto.randomUUID();
    await db.pool.query(`INSERT INTO signups (id, email) VALUES ($1, 'taken@example.com')`, [taken]);
    const id = crypto.randomUUID();
    const tasksBefore = await count(`SELECT count(*)::int AS n FROM outlive.tasks`);
    await expect(
      http.batch([
        batchEnqueue(http, welcome, { signupId: id }),
        http.insert(signups).values({ id, email: 'taken@example.com' }), // unique violation
      ]),
    ).rejects.toMatchObject({ code: '23505' });
    expect(await count(`SELECT count(*)::int AS n FROM outlive.tasks`)).toBe(tasksBefore);
    expect(await count(`SELECT count(*)::int AS n FROM signups WHERE id = $1`, [id])).toBe(0);
  });

  it('refuses an invalid input before anything is sent', async () => {
    const before = server.requests;
    expect(() => batchEnqueue(http, welcome, { signupId: 'not-a-uuid' })).toThrow(InvalidEnqueueError);
    expect(() => batchEnqueue(http, welcome, { signupId: crypto.randomUUID() }, { timeoutMs: -1 })).toThrow(/timeoutMs/);
    expect(() => batchEnqueue(http, welcome, { signupId: crypto.randomUUID() }, { key: '' })).toThrow(/key/);
    expect(server.requests).toBe(before);
  });

  it('returns the unfinished task with the same key instead of a second row', async () => {
    const id = crypto.randomUUID();
    const key = `welcome-${id}`;
    const [first] = await http.batch([batchEnqueue(http, welcome, { signupId: id }, { key })]);
    const [, second] = await http.batch([
      http.insert(signups).values({ id, email: `${id}@example.com` }),
      batchEnqueue(http, welcome, { signupId: id }, { key }),
    ]);
    const a = enqueuedFrom(welcome, first);
    const b = enqueuedFrom(welcome, second);
    expect(a.deduplicated).toBe(false);
    expect(b).toMatchObject({ id: a.id, deduplicated: true });
    expect(await count(`SELECT count(*)::int AS n FROM outlive.tasks WHERE key = $1`, [key])).toBe(1);
  });

  it('waits for a transaction still writing the key’s task: writes its own row if that one rolls back; if it commits, enqueuedFrom says the batch could not read that task', async () => {
    const id = crypto.randomUUID();
    const key = `race-${id}`;
    const first = await db.pool.connect();
    try {
      // Rolled back: the batch, which waited for it, writes the key's row itself.
      await first.query('BEGIN');
      await enqueue(first, welcome, { signupId: id }, { key });
      const waiting = http.batch([batchEnqueue(http, welcome, { signupId: id }, { key })]);
      await waitForLockWait();
      await first.query('ROLLBACK');
      const [mine] = await waiting;
      expect(enqueuedFrom(welcome, mine)).toMatchObject({ deduplicated: false });
      await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled' WHERE key = $1`, [key]);

      // Committed: the batch's statement cannot read that row; enqueuedFrom says so, and what returns it.
      await first.query('BEGIN');
      const theirs = await enqueue(first, welcome, { signupId: id }, { key });
      const blocked = http.batch([http.insert(signups).values({ id, email: `${id}@example.com` }), batchEnqueue(http, welcome, { signupId: id }, { key })]);
      await waitForLockWait();
      await first.query('COMMIT');
      const [, none] = await blocked;
      expect(() => enqueuedFrom(welcome, none)).toThrow(
        /^outlive: enqueuedFrom: this batch enqueued no "welcome" task: an enqueue of the same key by another transaction committed while the batch waited for it.*The batch has committed and the key has its one task; enqueue\(db, task, input, \{ key \}\) returns it \(deduplicated\)$/,
      );
      expect(() => enqueuedFrom(welcome, none)).toThrow(OutliveError);
      expect(await count(`SELECT count(*)::int AS n FROM signups WHERE id = $1`, [id])).toBe(1);
      expect(await enqueue(http, welcome, { signupId: id }, { key })).toMatchObject({ id: theirs.id, deduplicated: true });
      expect(await count(`SELECT count(*)::int AS n FROM outlive.tasks WHERE key = $1 AND state = 'pending'`, [key])).toBe(1);
    } finally {
      first.release();
    }
  });

  it('enqueues and deduplicates as a role that may only INSERT and SELECT tasks', async () => {
    const enqueuer = await createRole('batcher');
    await db.pool.query(
      `GRANT USAGE ON SCHEMA outlive TO ${enqueuer.name}; GRANT INSERT, SELECT ON outlive.tasks TO ${enqueuer.name}; ` +
        `GRANT USAGE ON SEQUENCE outlive.tasks_id_seq TO ${enqueuer.name}; GRANT INSERT ON signups TO ${enqueuer.name}`,
    );
    const asEnqueuer = drizzle(neon(neonUrl(enqueuer.urlOn(db.directUrl))));
    const id = crypto.randomUUID();
    const key = `role-${id}`;
    const [, a] = await asEnqueuer.batch([asEnqueuer.insert(signups).values({ id, email: `${id}@example.com` }), batchEnqueue(asEnqueuer, welcome, { signupId: id }, { key })]);
    const [b] = await asEnqueuer.batch([batchEnqueue(asEnqueuer, welcome, { signupId: id }, { key })]);
    expect(enqueuedFrom(welcome, a).deduplicated).toBe(false);
    expect(enqueuedFrom(welcome, b)).toMatchObject({ id: enqueuedFrom(welcome, a).id, deduplicated: true });
    // drizzle wraps the server's error.
    const refused = await asEnqueuer.execute(sql`UPDATE outlive.tasks SET key = NULL WHERE key = ${key}`).then(() => null, (e: Error) => e);
    expect((refused?.cause as Error | undefined)?.message).toMatch(/permission denied for table tasks/);
  });

  it('passes runAt and delayMs through, computed on the database clock', async () => {
    const runAt = new Date(Date.now() + 3_600_000);
    const [at, later] = await http.batch([
      batchEnqueue(http, welcome, { signupId: crypto.randomUUID() }, { runAt, queue: 'mail' }),
      batchEnqueue(http, welcome, { signupId: crypto.randomUUID() }, { delayMs: 60_000 }),
    ]);
    const a = enqueuedFrom(welcome, at);
    expect(a).toMatchObject({ queue: 'mail' });
    expect(a.runAt.getTime()).toBe(runAt.getTime());
    const b = await taskRow(db.pool, enqueuedFrom(welcome, later).id);
    const { ahead } = (
      await db.rows<{ ahead: number }>(`SELECT extract(epoch FROM run_at - created_at)::float8 AS ahead FROM outlive.tasks WHERE id = $1`, [b.id])
    )[0]!;
    expect(ahead).toBeCloseTo(60, 0);
  });
});

describe('the other writes over neon-http, one request each', () => {
  // Without db.batch each is its own request and commits alone; what matters
  // here is that each is one statement Neon's proxy runs as it is.
  it('enqueue, enqueueMany and startRun run through drizzle neon-http', async () => {
    const before = server.requests;
    const one = await enqueue(http, welcome, { signupId: crypto.randomUUID() }, { runAt: new Date(Date.now() + 60_000), key: `k-${crypto.randomUUID()}` });
    expect(await taskRow(db.pool, one.id)).toMatchObject({ state: 'pending' });
    const ids = [crypto.randomUUID(), crypto.randomUUID()];
    const many = await enqueueMany(http, welcome, ids.map((signupId) => ({ signupId })), { delayMs: 1_000 });
    expect(many.map((t) => t.deduplicated)).toEqual([false, false]);
    const run = await startRun(http, 'welcome-pair', { a: step(welcome, { signupId: ids[0]! }), b: step(welcome, { signupId: ids[1]! }, { after: ['a'] }) });
    expect(Object.keys(run.tasks).sort()).toEqual(['a', 'b']);
    expect(await count(`SELECT count(*)::int AS n FROM outlive.tasks WHERE run_id = $1`, [run.id])).toBe(2);
    expect(server.requests - before).toBe(3);
  });
});

describe('batchEnqueue in other drivers', () => {
  it('is the same statement in a node-postgres drizzle transaction, rolled back with it', async () => {
    const pgDb = drizzlePg(db.pool);
    const id = crypto.randomUUID();
    let taskId = '';
    await expect(
      pgDb.transaction(async (tx) => {
        taskId = enqueuedFrom(welcome, await batchEnqueue(tx, welcome, { signupId: id })).id;
        throw new Error('changed my mind');
      }),
    ).rejects.toThrow('changed my mind');
    expect(taskId).not.toBe('');
    expect(await taskRow(db.pool, taskId)).toBeUndefined();
    await pgDb.transaction(async (tx) => {
      taskId = enqueuedFrom(welcome, await batchEnqueue(tx, welcome, { signupId: id })).id;
    });
    expect(await taskRow(db.pool, taskId)).toMatchObject({ state: 'pending', input: { signupId: id } });
  });
});
