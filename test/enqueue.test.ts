import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { defineTask, enqueue, enqueueMany, InvalidEnqueueError, tick } from '../src/index.js';
import { freshDb } from './support/db.js';
import { countByState, taskRow } from './support/tasks.js';
import { createRole } from './support/roles.js';

const db = await freshDb();

const greet = defineTask({
  name: 'greet',
  input: z.object({ name: z.string().min(1) }),
  run: ({ name }) => `hello ${name}`,
});

async function inTransaction<T>(fn: (client: pg.PoolClient) => Promise<T>, outcome: 'COMMIT' | 'ROLLBACK' = 'COMMIT'): Promise<T> {
  const client = await db.pool.connect();
  try {
    await client.query('BEGIN');
    const result = await fn(client);
    await client.query(outcome);
    return result;
  } finally {
    client.release();
  }
}

async function clear() {
  await db.pool.query('DELETE FROM outlive.tasks');
}

describe('enqueue', () => {
  it('writes the row with the business write, in the caller’s transaction (pg client)', async () => {
    await clear();
    await db.pool.query('CREATE TABLE IF NOT EXISTS users (id serial PRIMARY KEY, name text)');
    const task = await inTransaction(async (tx) => {
      await tx.query(`INSERT INTO users (name) VALUES ('ada')`);
      return enqueue(tx, greet, { name: 'ada' }, { priority: 3, queue: 'mail', maxAttempts: 2 });
    });
    expect(task).toMatchObject({ name: 'greet', queue: 'mail', state: 'pending', deduplicated: false });
    const row = await taskRow(db.pool, task.id);
    expect(row).toMatchObject({ name: 'greet', queue: 'mail', priority: 3, max_attempts: 2, attempts: 0, input: { name: 'ada' } });
  });

  it('works inside a drizzle node-postgres transaction', async () => {
    await clear();
    const orm = drizzle(db.pool);
    const task = await orm.transaction(async (tx) => enqueue(tx, greet, { name: 'grace' }));
    expect((await taskRow(db.pool, task.id)).input).toEqual({ name: 'grace' });
    await expect(
      orm.transaction(async (tx) => {
        await enqueue(tx, greet, { name: 'never' });
        tx.rollback();
      }),
    ).rejects.toThrow();
    expect(await db.rows(`SELECT 1 FROM outlive.tasks WHERE input->>'name' = 'never'`)).toHaveLength(0);
  });

  it('leaves no row behind when the transaction rolls back, and wakes nobody', async () => {
    await clear();
    // LISTEN needs a session of its own, which no transaction pooler gives.
    const listener = new pg.Client({ connectionString: db.directUrl });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query('LISTEN outlive');
    await inTransaction((tx) => enqueue(tx, greet, { name: 'ghost' }), 'ROLLBACK');
    // A round trip on the listener flushes any notification already sent.
    await listener.query('SELECT 1');
    expect(await db.rows('SELECT * FROM outlive.tasks')).toHaveLength(0);
    expect(heard).toEqual([]);
    await listener.end();
  });

  it('notifies listeners only after commit', async () => {
    await clear();
    // LISTEN needs a session of its own, which no transaction pooler gives.
    const listener = new pg.Client({ connectionString: db.directUrl });
    await listener.connect();
    const heard: string[] = [];
    const arrived = new Promise<void>((resolve) => listener.on('notification', (n) => (heard.push(n.payload ?? ''), resolve())));
    await listener.query('LISTEN outlive');
    const client = await db.pool.connect();
    await client.query('BEGIN');
    await enqueueMany(client, greet, [{ name: 'a' }, { name: 'b' }, { name: 'c' }], { queue: 'mail' });
    await listener.query('SELECT 1');
    expect(heard).toEqual([]);
    await client.query('COMMIT');
    client.release();
    await arrived;
    await listener.query('SELECT 1');
    // Three rows in one queue fold into one notification.
    expect(heard).toEqual(['mail']);
    await listener.end();
  });

  it('bulk-enqueues many tasks in one statement, returning them in order', async () => {
    await clear();
    const inputs = Array.from({ length: 5_000 }, (_, i) => ({ name: `n${i}` }));
    const tasks = await enqueueMany(db.pool, greet, inputs);
    expect(tasks).toHaveLength(5_000);
    const rows = await db.rows<{ id: string; name: string }>(`SELECT id::text, input->>'name' AS name FROM outlive.tasks`);
    const byId = new Map(rows.map((r) => [r.id, r.name]));
    tasks.forEach((t, i) => expect(byId.get(t.id)).toBe(`n${i}`));
    expect(await enqueueMany(db.pool, greet, [])).toEqual([]);
  });

  it('honours runAt and delayMs', async () => {
    await clear();
    const at = new Date('2030-01-01T00:00:00Z');
    const later = await enqueue(db.pool, greet, { name: 'x' }, { runAt: at });
    expect(later.runAt.toISOString()).toBe(at.toISOString());
    const [{ now }] = (await db.rows<{ now: Date }>('SELECT now()')) as [{ now: Date }];
    const delayed = await enqueue(db.pool, greet, { name: 'y' }, { delayMs: 60_000 });
    expect(delayed.runAt.getTime() - now.getTime()).toBeGreaterThanOrEqual(59_000);
    // Neither is ready now.
    const report = await tick(db.pool, { tasks: [greet] });
    expect(report.claimed).toBe(0);
  });
});

describe('idempotency keys', () => {
  it('returns the unfinished task instead of a duplicate, and frees the key once it finished', async () => {
    await clear();
    const first = await enqueue(db.pool, greet, { name: 'k' }, { key: 'user-1' });
    const second = await enqueue(db.pool, greet, { name: 'k2' }, { key: 'user-1' });
    expect(second).toMatchObject({ id: first.id, deduplicated: true });
    // Another task name does not share the key space.
    const other = defineTask({ name: 'other', input: z.object({}), run: () => null });
    expect((await enqueue(db.pool, other, {}, { key: 'user-1' })).deduplicated).toBe(false);

    await tick(db.pool, { tasks: [greet, other] });
    expect((await taskRow(db.pool, first.id)).state).toBe('succeeded');
    const third = await enqueue(db.pool, greet, { name: 'k3' }, { key: 'user-1' });
    expect(third.deduplicated).toBe(false);
    expect(third.id).not.toBe(first.id);
  });

  it('stays one row under 20 concurrent enqueues of the same key', async () => {
    await clear();
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        inTransaction(async (tx) => {
          const t = await enqueue(tx, greet, { name: `c${i}` }, { key: 'race' });
          // Hold the transaction open a little so the enqueues overlap.
          await tx.query('SELECT pg_sleep(0.01)');
          return t;
        }),
      ),
    );
    expect(new Set(results.map((r) => r.id)).size).toBe(1);
    expect(results.filter((r) => !r.deduplicated)).toHaveLength(1);
    expect(await db.rows(`SELECT 1 FROM outlive.tasks WHERE key = 'race'`)).toHaveLength(1);
  });

  it('lets a concurrent enqueue take the key when the first one rolls back', async () => {
    await clear();
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    await a.query('BEGIN');
    await enqueue(a, greet, { name: 'a' }, { key: 'rb' });
    await b.query('BEGIN');
    const pendingB = enqueue(b, greet, { name: 'b' }, { key: 'rb' }); // waits on a's row
    await new Promise((r) => setTimeout(r, 50));
    await a.query('ROLLBACK');
    const fromB = await pendingB;
    await b.query('COMMIT');
    a.release();
    b.release();
    expect(fromB.deduplicated).toBe(false);
    const rows = await db.rows<{ input: { name: string } }>(`SELECT input FROM outlive.tasks WHERE key = 'rb'`);
    expect(rows.map((r) => r.input.name)).toEqual(['b']);
  });

  it('folds repeated keys within one bulk enqueue', async () => {
    await clear();
    const tasks = await enqueueMany(db.pool, greet, [{ name: 'a' }, { name: 'b' }, { name: 'a' }], { key: (i) => i.name });
    expect(tasks.map((t) => t.deduplicated)).toEqual([false, false, true]);
    expect(tasks[0]!.id).toBe(tasks[2]!.id);
    expect(await countByState(db.pool)).toEqual({ pending: 2 });
  });
});

describe('bad input gets a clear error and writes nothing', () => {
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  const anyTask = defineTask({ name: 'any', input: z.any(), run: () => null });
  const cases: Array<[string, () => Promise<unknown>, RegExp]> = [
    ['input failing the schema', () => enqueue(db.pool, greet, { name: '' }), /name: .*(too small|>=1|at least)/i],
    ['input of the wrong type', () => enqueue(db.pool, greet, { name: 42 } as never), /name: .*expected string/i],
    ['input that is not JSON (cycle)', () => enqueue(db.pool, anyTask, cyclic), /does not serialise to JSON/],
    ['input that is not JSON (bigint)', () => enqueue(db.pool, anyTask, { n: 1n }), /does not serialise to JSON/],
    ['input that is undefined', () => enqueue(db.pool, anyTask, undefined), /does not serialise to JSON/],
    ['oversized input', () => enqueue(db.pool, anyTask, { blob: 'x'.repeat(1_100_000) }), /over the limit of 1048576/],
    ['a negative delay', () => enqueue(db.pool, greet, { name: 'a' }, { delayMs: -5 }), /delayMs must be/],
    ['a non-finite delay', () => enqueue(db.pool, greet, { name: 'a' }, { delayMs: Infinity }), /delayMs must be/],
    ['max attempts below 1', () => enqueue(db.pool, greet, { name: 'a' }, { maxAttempts: 0 }), /maxAttempts must be a whole number from 1/],
    ['max attempts not whole', () => enqueue(db.pool, greet, { name: 'a' }, { maxAttempts: 1.5 }), /maxAttempts/],
    ['an invalid runAt', () => enqueue(db.pool, greet, { name: 'a' }, { runAt: new Date('nope') }), /runAt must be a valid Date/],
    ['runAt and delayMs together', () => enqueue(db.pool, greet, { name: 'a' }, { runAt: new Date(), delayMs: 5 }), /not both/],
    ['a bad queue name', () => enqueue(db.pool, greet, { name: 'a' }, { queue: "q'; DROP TABLE x;--" }), /queue name .* is invalid/],
    ['an empty key', () => enqueue(db.pool, greet, { name: 'a' }, { key: '' }), /key must be a non-empty string/],
    ['a fractional priority', () => enqueue(db.pool, greet, { name: 'a' }, { priority: 0.5 }), /priority must be/],
    ['something that is not a task', () => enqueue(db.pool, { name: 'x' } as never, {} as never), /needs a task made by defineTask/],
    ['a delay past any date', () => enqueue(db.pool, greet, { name: 'a' }, { delayMs: 1e300 }), /delayMs must be a number of milliseconds from 0 to 3155760000000 \(100 years\), got 1e\+300/],
    ['a runAt before the year 1', () => enqueue(db.pool, greet, { name: 'a' }, { runAt: new Date(-8.64e15) }), /runAt must be a valid Date, from the year 1 on/],
    // A task object built by hand (or by another version) with a name defineTask refuses.
    ['a task whose name defineTask would refuse', () => enqueue(db.pool, { ...greet, name: 'x\u001b]0;owned\u0007' }, { name: 'a' }), /cannot enqueue: task name "x\\u001b\]0;owned\\u0007" is invalid/],
    ['a task with an empty name', () => enqueueMany(db.pool, { ...greet, name: '' }, [{ name: 'a' }]), /task name "" is invalid/],
    ['one bad input among many', () => enqueueMany(db.pool, greet, [{ name: 'ok' }, { name: '' }]), /input does not match its schema/],
  ];
  it.each(cases)('%s', async (_label, call, message) => {
    await clear();
    const err = await call().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(InvalidEnqueueError);
    expect((err as Error).message).toMatch(message);
    expect(await db.rows('SELECT 1 FROM outlive.tasks')).toHaveLength(0);
  });

  it('refuses a 100 MB input before its schema reads it or JSON.stringify copies it', async () => {
    await clear();
    let validated = 0;
    const counting = defineTask({
      name: 'counting',
      input: { '~standard': { version: 1, vendor: 'test', validate: (value: unknown) => (validated++, { value }) } },
      run: () => null,
    });
    const huge = { s: 'x'.repeat(100_000_000) };
    const stringify = vi.spyOn(JSON, 'stringify');
    try {
      await expect(enqueue(db.pool, counting, huge)).rejects.toThrow(/cannot enqueue "counting": input is at least 100000004 bytes of JSON, over the limit of 1048576/);
      expect(stringify).not.toHaveBeenCalledWith(huge);
    } finally {
      stringify.mockRestore();
    }
    expect(validated).toBe(0);
    // Within the limit, the schema runs and the input is stored as before.
    await enqueue(db.pool, counting, { s: 'x'.repeat(1_000) });
    expect(validated).toBe(1);
  });

  it('stores SQL-looking strings as plain data', async () => {
    await clear();
    const name = "'); DROP TABLE outlive.tasks; --";
    const t = await enqueue(db.pool, greet, { name }, { key: "k'; --" });
    expect((await taskRow(db.pool, t.id)).input).toEqual({ name });
  });
});

describe('idempotency keys, each key written or found once', () => {
  it('returns one entry per input in order: unkeyed and new keys written, taken keys found, repeated keys folded', async () => {
    await clear();
    const taken = await enqueue(db.pool, greet, { name: 'before' }, { key: 'k-taken' });
    const inputs = [{ name: 'a' }, { name: 'k-taken' }, { name: 'b' }, { name: 'k-new' }, { name: 'c' }, { name: 'k-new' }, { name: 'k-taken' }];
    const tasks = await enqueueMany(db.pool, greet, inputs, { key: (i) => (i.name.startsWith('k-') ? i.name : `${i.name}-${Math.random()}`) });
    expect(tasks.map((t) => t.deduplicated)).toEqual([false, true, false, false, false, true, true]);
    expect(tasks[1]!.id).toBe(taken.id);
    expect(tasks[6]!.id).toBe(taken.id);
    expect(tasks[5]!.id).toBe(tasks[3]!.id);
    const rows = await db.rows<{ id: string; name: string }>(`SELECT id::text, input->>'name' AS name FROM outlive.tasks`);
    const nameOf = new Map(rows.map((r) => [r.id, r.name]));
    expect(tasks.map((t) => nameOf.get(t.id))).toEqual(['a', 'before', 'b', 'k-new', 'c', 'k-new', 'before']);
    const unkeyed = await enqueueMany(db.pool, greet, [{ name: 'x' }, { name: 'y' }, { name: 'z' }]);
    expect(unkeyed.map((t) => nameOf.get(t.id) ?? 'new')).toEqual(['new', 'new', 'new']);
    expect(unkeyed.map((t) => t.id)).toEqual([...unkeyed.map((t) => t.id)].sort((a, b) => Number(a) - Number(b)));
  });

  it('writes the key again when the unfinished task that held it finishes between the insert and the read', async () => {
    await clear();
    const first = await enqueue(db.pool, greet, { name: 'first' }, { key: 'finishing' });
    const client = await db.pool.connect();
    let inserts = 0;
    // The caller's client, as enqueue sees it: after the insert that found the
    // key taken, the task holding it finishes, before enqueue reads it.
    const racing = {
      async query(text: string, params?: unknown[]) {
        const result = await client.query(text, params);
        if (/^\s*INSERT INTO outlive\.tasks/.test(text) && inserts++ === 0) {
          await db.pool.query(`UPDATE outlive.tasks SET state = 'succeeded', finished_at = now() WHERE id = $1`, [first.id]);
        }
        return result;
      },
    };
    try {
      const second = await enqueue(racing as never, greet, { name: 'second' }, { key: 'finishing' });
      expect(second).toMatchObject({ deduplicated: false, state: 'pending' });
      expect(second.id).not.toBe(first.id);
      expect(inserts).toBe(2);
    } finally {
      client.release();
    }
    expect(await db.rows(`SELECT input->>'name' AS name, state::text FROM outlive.tasks WHERE key = 'finishing' ORDER BY id`)).toEqual([
      { name: 'first', state: 'succeeded' },
      { name: 'second', state: 'pending' },
    ]);
  });
});

// The review's attack: when enqueue wrote ON CONFLICT DO UPDATE SET key =
// excluded.key, a role that may only enqueue had to hold UPDATE on every
// task's key, and with it cleared another writer's key; the next enqueue of
// that key wrote a second charge. Here the role holds INSERT and SELECT only.
describe('a role that may only INSERT and SELECT tasks', async () => {
  const enqueuer = await createRole('enqueuer');
  await db.pool.query(
    `GRANT USAGE ON SCHEMA outlive TO ${enqueuer.name}; GRANT INSERT, SELECT ON outlive.tasks TO ${enqueuer.name}; GRANT USAGE ON SEQUENCE outlive.tasks_id_seq TO ${enqueuer.name}`,
  );
  const asEnqueuer = db.newPool({ connectionString: enqueuer.urlOn(db.directUrl), max: 25 });
  // The role is dropped after the file, its idle sessions ended first.
  asEnqueuer.on('error', () => undefined);
  const charge = defineTask({ name: 'charge', input: z.object({ order: z.string() }), run: () => 'charged' });

  it('enqueues, enqueues many and deduplicates, in its own transactions too', async () => {
    await clear();
    const [who] = (await asEnqueuer.query<{ u: string; s: boolean }>(`SELECT current_user AS u, usesuper AS s FROM pg_user WHERE usename = current_user`)).rows;
    expect(who).toEqual({ u: enqueuer.name, s: false });
    const first = await enqueue(asEnqueuer, charge, { order: 'o-1' }, { key: 'order-1' });
    const again = await enqueue(asEnqueuer, charge, { order: 'o-1' }, { key: 'order-1' });
    expect(again).toMatchObject({ id: first.id, deduplicated: true, state: 'pending' });
    const many = await enqueueMany(asEnqueuer, charge, [{ order: 'o-1' }, { order: 'o-2' }, { order: 'o-2' }], { key: (i) => `order-${i.order.slice(2)}` });
    expect(many.map((t) => [t.id === first.id, t.deduplicated])).toEqual([[true, true], [false, false], [false, true]]);
    const client = await asEnqueuer.connect();
    try {
      await client.query('BEGIN');
      const inTx = await enqueue(client, charge, { order: 'o-3' }, { key: 'order-3' });
      expect(await enqueue(client, charge, { order: 'o-3' }, { key: 'order-3' })).toMatchObject({ id: inTx.id, deduplicated: true });
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    expect(await db.rows(`SELECT count(*)::int AS n FROM outlive.tasks`)).toEqual([{ n: 3 }]);
  });

  it('stays one row under 20 concurrent enqueues of one key, and takes the key when the first rolls back', async () => {
    await clear();
    const results = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const c = await asEnqueuer.connect();
        try {
          await c.query('BEGIN');
          const t = await enqueue(c, charge, { order: `c${i}` }, { key: 'race' });
          await c.query('SELECT pg_sleep(0.01)');
          await c.query('COMMIT');
          return t;
        } finally {
          c.release();
        }
      }),
    );
    expect(new Set(results.map((r) => r.id)).size).toBe(1);
    expect(results.filter((r) => !r.deduplicated)).toHaveLength(1);
    const a = await asEnqueuer.connect();
    const b = await asEnqueuer.connect();
    try {
      await a.query('BEGIN');
      await enqueue(a, charge, { order: 'a' }, { key: 'rb' });
      await b.query('BEGIN');
      const fromB = enqueue(b, charge, { order: 'b' }, { key: 'rb' }); // waits on a's row
      await new Promise((r) => setTimeout(r, 50));
      await a.query('ROLLBACK');
      expect(await fromB).toMatchObject({ deduplicated: false });
      await b.query('COMMIT');
    } finally {
      a.release();
      b.release();
    }
    expect(await db.rows(`SELECT input->>'order' AS o FROM outlive.tasks WHERE key = 'rb'`)).toEqual([{ o: 'b' }]);
  });

  it('cannot clear or delete another writer’s key, so its next enqueue of that key still finds the first charge', async () => {
    await clear();
    const theirs = await enqueue(db.pool, charge, { order: 'o-9' }, { key: 'order-9' });
    await expect(asEnqueuer.query(`UPDATE outlive.tasks SET key = NULL WHERE key = 'order-9'`)).rejects.toThrow(/permission denied for table tasks/);
    await expect(asEnqueuer.query(`DELETE FROM outlive.tasks WHERE key = 'order-9'`)).rejects.toThrow(/permission denied for table tasks/);
    await expect(asEnqueuer.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, key) VALUES ('charge', '{}', 1, 1000, 'order-9') ON CONFLICT (name, key) WHERE key IS NOT NULL AND state IN ('pending', 'running') DO UPDATE SET key = NULL`)).rejects.toThrow(/permission denied for table tasks/);
    expect(await enqueue(asEnqueuer, charge, { order: 'o-9' }, { key: 'order-9' })).toMatchObject({ id: theirs.id, deduplicated: true });
    expect(await db.rows(`SELECT count(*)::int AS n FROM outlive.tasks WHERE name = 'charge'`)).toEqual([{ n: 1 }]);
  });
});
