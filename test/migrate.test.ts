import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate as drizzleMigrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { migrate } from '../src/node/index.js';
import { closePool, emptyDatabase, openPool } from './support/db.js';
import { MIGRATION_LOCK, MIGRATIONS_FOLDER } from '../src/node/migrate.js';

/** Applies the migrations up to and including `last` (a journal tag's number), as an older outlive would have. */
async function migrateUpTo(client: pg.Client, last: number): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'outlive-mig-'));
  try {
    const journal = JSON.parse(readFileSync(join(MIGRATIONS_FOLDER, 'meta/_journal.json'), 'utf8'));
    journal.entries = journal.entries.filter((e: { idx: number }) => e.idx <= last);
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    writeFileSync(join(dir, 'meta/_journal.json'), JSON.stringify(journal));
    await drizzleMigrate(drizzle(client), { migrationsFolder: dir, migrationsSchema: 'outlive', migrationsTable: 'migrations' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Runs `body` on a new empty database brought up to migration `last`, with a client on it; drops the database after. */
async function atMigration(last: number, body: (c: pg.Client, url: string) => Promise<void>): Promise<void> {
  const { directUrl: url, drop } = await emptyDatabase();
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await migrateUpTo(c, last);
    await body(c, url);
  } finally {
    await c.end();
    await drop();
  }
}

describe('migrate', () => {
  it('is safe to run twice, and from several processes at once', async () => {
    const { directUrl: url, drop } = await emptyDatabase();
    try {
      await Promise.all([migrate(url), migrate(url), migrate(url)]);
      await migrate(url);
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      const applied = await c.query('SELECT count(*)::int AS n FROM outlive.migrations');
      const tables = await c.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = 'outlive' ORDER BY 1`);
      await c.end();
      expect(applied.rows[0].n).toBeGreaterThanOrEqual(2);
      expect(tables.rows.map((r) => r.table_name)).toEqual(expect.arrayContaining(['migrations', 'runs', 'task_deps', 'tasks']));
    } finally {
      await drop();
    }
  });

  it('moves dependency edges from their tasks to their run, keeping the edges of existing runs (0007)', async () => {
    await atMigration(6, async (c, url) => {
      const { rows: [run] } = await c.query(`INSERT INTO outlive.runs (name, unfinished) VALUES ('old', 2) RETURNING id::text`);
      const { rows: tasks } = await c.query(
        `INSERT INTO outlive.tasks (run_id, step, name, input, max_attempts, timeout_ms, waiting_on)
         VALUES ($1, 'a', 't', '{}', 1, 1000, 0), ($1, 'b', 't', '{}', 1, 1000, 1) RETURNING id::text`,
        [run.id],
      );
      await c.query(`INSERT INTO outlive.task_deps (task_id, depends_on) VALUES ($1, $2)`, [tasks[1].id, tasks[0].id]);

      await migrate(url);
      const edges = await c.query(`SELECT run_id::text, task_id::text, depends_on::text FROM outlive.task_deps`);
      expect(edges.rows).toEqual([{ run_id: run.id, task_id: tasks[1].id, depends_on: tasks[0].id }]);
      // No foreign key from the edges to outlive.tasks is left: deleting a
      // task row runs no cascade query.
      const fks = await c.query(
        `SELECT confrelid::regclass::text AS target FROM pg_constraint WHERE conrelid = 'outlive.task_deps'::regclass AND contype = 'f'`,
      );
      expect(fks.rows).toEqual([{ target: 'outlive.runs' }]);
      // The edges go with their run.
      await c.query(`DELETE FROM outlive.runs WHERE id = $1`, [run.id]);
      expect((await c.query(`SELECT count(*)::int AS n FROM outlive.task_deps`)).rows[0].n).toBe(0);
      expect((await c.query(`SELECT count(*)::int AS n FROM outlive.tasks`)).rows[0].n).toBe(0);
    });
  });

  it('repairs the counts the double release left, then refuses a negative one; the pass runs what was stuck (0010)', async () => {
    await atMigration(9, async (c, url) => {
      const { rows: [run] } = await c.query(`INSERT INTO outlive.runs (name, unfinished) VALUES ('old', 2) RETURNING id::text`);
      // a succeeded; b waits for a and was released twice (-1); c waits for a and b but was never released for a (2).
      const { rows: t } = await c.query(
        `INSERT INTO outlive.tasks (run_id, step, name, input, max_attempts, timeout_ms, state, waiting_on, finished_at)
         VALUES ($1, 'a', 'x', '{}', 1, 1000, 'succeeded', 0, now()), ($1, 'b', 'x', '{}', 1, 1000, 'pending', -1, NULL),
                ($1, 'c', 'x', '{}', 1, 1000, 'pending', 2, NULL)
         RETURNING id::text, step`,
        [run.id],
      );
      const id = Object.fromEntries(t.map((r: { id: string; step: string }) => [r.step, r.id]));
      await c.query(`INSERT INTO outlive.task_deps (run_id, task_id, depends_on) VALUES ($1, $2, $3), ($1, $4, $3), ($1, $4, $2)`, [run.id, id.b, id.a, id.c]);
      await migrate(url);
      const counts = await c.query(`SELECT step, waiting_on FROM outlive.tasks WHERE state = 'pending' ORDER BY step`);
      expect(counts.rows).toEqual([{ step: 'b', waiting_on: 0 }, { step: 'c', waiting_on: 1 }]);
      await expect(c.query(`UPDATE outlive.tasks SET waiting_on = -1 WHERE id = $1`, [id.b])).rejects.toThrow(/tasks_waiting_on_check/);
      const { tick, defineTask } = await import('../src/index.js');
      const { z } = await import('zod');
      const x = defineTask({ name: 'x', input: z.object({}), run: () => 'ok' });
      const pool = openPool({ connectionString: url });
      try {
        for (let i = 0; i < 3; i++) await tick(pool, { tasks: [x] });
      } finally {
        await closePool(pool);
      }
      expect((await c.query(`SELECT state::text, unfinished FROM outlive.runs WHERE id = $1`, [run.id])).rows[0]).toEqual({ state: 'succeeded', unfinished: 0 });
    });
  });

  it('carries tasks running under per-task leases (0010) over to pass leases (0011): the dead pass’s row is recovered and runs once, the live one is left to its pass', async () => {
    await atMigration(10, async (c, url) => {
      // dead: its pass died, its lease expired; alive: a pass of the previous
      // release still runs it, extending its row's lease; ready: pending.
      const { rows } = await c.query(
        `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms, state, attempts, lease_owner, lease_expires_at, started_at)
         VALUES ('inflight', '{"k":"dead"}', 3, 10000, 'running', 1, 'old-dead', now() - interval '1 second', now() - interval '1 minute'),
                ('inflight', '{"k":"alive"}', 3, 10000, 'running', 1, 'old-alive', now() + interval '1 hour', now() - interval '1 minute'),
                ('inflight', '{"k":"ready"}', 3, 10000, 'pending', 0, NULL, NULL, NULL)
         RETURNING id::text, input->>'k' AS k`,
      );
      const id = Object.fromEntries(rows.map((r: { id: string; k: string }) => [r.k, r.id]));
      await migrate(url);
      const { tick, recover, defineTask } = await import('../src/index.js');
      const { z } = await import('zod');
      const ran: string[] = [];
      const inflight = defineTask({ name: 'inflight', input: z.object({ k: z.string() }), timeoutMs: 10_000, run: ({ k }) => void ran.push(k) });
      const pool = openPool({ connectionString: url });
      try {
        const first = await tick(pool, { tasks: [inflight] });
        expect(first).toMatchObject({ recovered: 1, succeeded: 1 });
        // The recovered attempt backs off 1 s: a pass after that runs it.
        const later = new Date(Date.now() + 5_000);
        await tick(pool, { tasks: [inflight], now: later });
        expect(ran.sort()).toEqual(['dead', 'ready']);
        const state = async (k: string) => (await c.query(`SELECT state::text, attempts, lease_owner FROM outlive.tasks WHERE id = $1`, [id[k]])).rows[0];
        expect(await state('dead')).toEqual({ state: 'succeeded', attempts: 2, lease_owner: null });
        // Still its old pass's while that pass extends its row.
        expect(await state('alive')).toEqual({ state: 'running', attempts: 1, lease_owner: 'old-alive' });
        // Once that pass is gone too, its row is recovered like any other.
        expect((await recover(pool, { now: new Date(Date.now() + 2 * 3_600_000) })).rows.map((r) => r.id)).toEqual([id.alive]);
      } finally {
        await closePool(pool);
      }
    });
  });

  it('keeps the task names passes of 0011 announced (0012): no word on their budgets until a pass says, and the schema refuses half a word', async () => {
    await atMigration(11, async (c, url) => {
      await c.query(`INSERT INTO outlive.known_tasks (name, seen_at) VALUES ('announced', now())`);
      await c.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('announced', '{}', 3, 600000)`);
      await migrate(url);
      expect((await c.query(`SELECT name, longest_ms, longest_at FROM outlive.known_tasks`)).rows).toEqual([{ name: 'announced', longest_ms: null, longest_at: null }]);
      const { status } = await import('../src/admin/queries.js');
      const { tick, defineTask } = await import('../src/index.js');
      const { z } = await import('zod');
      const pool = openPool({ connectionString: url });
      try {
        // A pass of the previous release knows it and said nothing of its budget: ready, not unrunnable.
        expect((await status(pool)).unrunnable).toEqual([]);
        // A pass of this release with a budget of 10 s says what it can give.
        const announced = defineTask({ name: 'announced', input: z.object({}), timeoutMs: 1_000, run: () => null });
        await tick(pool, { tasks: [announced], budgetMs: 10_000, reserveMs: 250, queues: ['none'] });
        expect((await status(pool)).unrunnable).toEqual([{ name: 'announced', ready: 1, why: expect.stringMatching(/its timeoutMs of 600000 ms is longer than the 9750 ms/) }]);
        await expect(c.query(`UPDATE outlive.known_tasks SET longest_at = NULL`)).rejects.toThrow(/known_tasks_longest_check/);
        await expect(c.query(`UPDATE outlive.known_tasks SET longest_ms = 0`)).rejects.toThrow(/known_tasks_longest_check/);
      } finally {
        await closePool(pool);
      }
    });
  });

  // migrate() applies the files itself (an app need not have drizzle-orm);
  // databases migrated by earlier releases used drizzle's migrator.
  it("records each file as drizzle's migrator does, so either one goes on from where the other stopped", async () => {
    const { readMigrationFiles } = await import('drizzle-orm/migrator');
    const { readMigrations } = await import('../src/node/migrate.js');
    const ours = readMigrations(MIGRATIONS_FOLDER).map((m) => ({ hash: m.hash, when: m.when, statements: m.statements }));
    const theirs = readMigrationFiles({ migrationsFolder: MIGRATIONS_FOLDER }).map((m) => ({ hash: m.hash, when: m.folderMillis, statements: m.sql }));
    expect(ours).toEqual(theirs);
    await atMigration(5, async (c, url) => {
      await migrate(url);
      const rows = (await c.query(`SELECT hash, created_at::float8 AS created_at FROM outlive.migrations ORDER BY id`)).rows;
      expect(rows).toEqual(ours.map((m) => ({ hash: m.hash, created_at: m.when })));
    });
  });

  // Through a transaction pooler the session lock of 0000-0010's migrate()
  // and its unlock could land on different server connections, leaving the
  // lock held by a pooled backend, and every later migrate waited forever.
  it('takes a lock that ends with its transaction, and says what to do instead of waiting forever for one held elsewhere', async () => {
    const { directUrl: url, drop } = await emptyDatabase();
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    try {
      await migrate(url);
      // The lock of migrate() is gone with its transaction: no advisory lock is left on the server.
      const left = await holder.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'`);
      expect(left.rows[0].n).toBe(0);
      // A session holding the migration lock (as a leaked one would).
      await holder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
      const started = Date.now();
      await expect(migrate(url, { lockTimeoutMs: 300 })).rejects.toThrow(
        /could not take the migration lock within 300 ms: .*another migrate is running, or a session holds the lock \(pid \d+\)/,
      );
      expect(Date.now() - started).toBeLessThan(5_000);
      await holder.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
      await migrate(url, { lockTimeoutMs: 300 });
    } finally {
      await holder.end();
      await drop();
    }
  });

  it('fails with the database’s own message on a URL that does not answer', async () => {
    await expect(migrate('postgres://postgres@127.0.0.1:1/nowhere')).rejects.toThrow(/ECONNREFUSED/);
  });
});
