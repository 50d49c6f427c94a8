import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { migrate } from '../src/node/index.js';
import { closePool, emptyDatabase, openPool } from './support/db.js';
import { MIGRATION_LOCK, MIGRATIONS_FOLDER, readMigrations } from '../src/node/migrate.js';
import { createRole } from './support/roles.js';
import { migrateUpTo } from './support/migrations.js';

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

  it('applies each missing migration once when several migrate a schema behind at once (they queue on outlive.migrations), and says what it did', async () => {
    await atMigration(5, async (c, url) => {
      const all = readMigrations(MIGRATIONS_FOLDER);
      const reports = await Promise.all([migrate(url), migrate(url), migrate(url)]);
      // One of them applied the rest; the others found nothing left to do.
      expect(reports.map((r) => r.applied.length).sort()).toEqual([0, 0, all.length - 6]);
      expect(reports.find((r) => r.applied.length > 0)!.applied).toEqual(all.slice(6).map((m) => m.tag));
      expect(reports.every((r) => r.total === all.length)).toBe(true);
      const rows = (await c.query(`SELECT hash FROM outlive.migrations ORDER BY id`)).rows.map((r) => r.hash);
      expect(rows).toEqual(all.map((m) => m.hash));
      expect(await migrate(url)).toEqual({ applied: [], total: all.length });
      const locks = await c.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' OR relation = 'outlive.migrations'::regclass`);
      expect(locks.rows[0].n).toBe(0);
    });
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
    const holder = new pg.Client({ connectionString: url, application_name: 'outlive-test-holder' });
    await holder.connect();
    try {
      // The first migrate, with nothing there yet, takes the advisory lock.
      await holder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
      let started = Date.now();
      await expect(migrate(url, { lockTimeoutMs: 300 })).rejects.toThrow(
        /could not take the migration lock within 300 ms: .*another migrate is running, or a session holds the lock \(pid \d+, role "postgres", application_name "outlive-test-holder"\)/,
      );
      expect(Date.now() - started).toBeLessThan(5_000);
      await holder.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
      await migrate(url);
      // The lock of migrate() is gone with its transaction: no lock is left on the server.
      const left = await holder.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' OR relation = 'outlive.migrations'::regclass`);
      expect(left.rows[0].n).toBe(0);
      // Later ones lock outlive.migrations; a transaction holding it (as a stuck migrate would).
      await holder.query('BEGIN');
      await holder.query('LOCK TABLE outlive.migrations IN SHARE ROW EXCLUSIVE MODE');
      started = Date.now();
      await expect(migrate(url, { lockTimeoutMs: 300 })).rejects.toThrow(
        /could not take the migration lock within 300 ms: .*a session holds the lock \(pid \d+, role "postgres", application_name "outlive-test-holder"\)/,
      );
      expect(Date.now() - started).toBeLessThan(5_000);
      await holder.query('ROLLBACK');
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

/** Runs statements on `url` as one client (as the role the URL names), then closes it. */
async function run(url: string, ...statements: string[]): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    for (const s of statements) await c.query(s);
  } finally {
    await c.end();
  }
}

async function one<R>(url: string, text: string): Promise<R> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query(text)).rows[0] as R;
  } finally {
    await c.end();
  }
}

/** The error `promise` rejects with. */
async function refusal(promise: Promise<unknown>): Promise<Error> {
  const err = await promise.then(() => null, (e: unknown) => e as Error);
  expect(err, 'migrate was expected to refuse').toBeInstanceOf(Error);
  return err!;
}

// What a role that may CREATE in the database (or in schema outlive) can
// plant for the role that migrates to run: the review's attacks, on a real
// PostgreSQL with real roles. migrate() here runs as the suite's superuser.
describe('migrate in a database other roles share', () => {
  it('refuses a schema another role made first, before running anything in it: the planted trigger never fires', async () => {
    const { directUrl: url } = await emptyDatabase();
    const other = await createRole('planter');
    await run(url, `GRANT CREATE ON DATABASE ${new URL(url).pathname.slice(1)} TO ${other.name}`, 'CREATE TABLE public.hits (who text)', 'GRANT INSERT ON public.hits TO PUBLIC');
    await run(
      other.urlOn(url),
      'CREATE SCHEMA outlive',
      'CREATE TABLE outlive.migrations (id serial PRIMARY KEY, hash text NOT NULL, created_at bigint)',
      `CREATE FUNCTION outlive.planted() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.hits VALUES (current_user); RETURN NEW; END $$`,
      'CREATE TRIGGER planted BEFORE INSERT ON outlive.migrations FOR EACH ROW EXECUTE FUNCTION outlive.planted()',
    );
    const err = await refusal(migrate(url));
    expect(err.message).toMatch(new RegExp(`^outlive: migrate refuses schema outlive: .*schema outlive is owned by role "${other.name}", not by "postgres"`));
    expect(err.message).toContain(`ALTER SCHEMA outlive OWNER TO postgres`);
    expect(err.message).toContain(`ALTER FUNCTION outlive.planted() OWNER TO postgres`);
    expect(err.message).toContain(`run migrate as "${other.name}"`);
    expect(err.message).toMatch(/trigger "planted" on outlive\.migrations was not made by outlive's migrations/);
    expect(await one(url, 'SELECT count(*)::int AS n FROM public.hits')).toEqual({ n: 0 });
    expect(await one(url, `SELECT nspowner::regrole::text AS owner, (SELECT count(*)::int FROM pg_class WHERE relnamespace = n.oid AND relkind = 'r') AS tables FROM pg_namespace n WHERE nspname = 'outlive'`)).toEqual({ owner: other.name, tables: 1 });
  });

  it('refuses a schema outlive that has no outlive.migrations table: migrate makes both at once, so it did not make this one', async () => {
    const { directUrl: url } = await emptyDatabase();
    await run(url, 'CREATE SCHEMA outlive', 'CREATE VIEW outlive.tasks AS SELECT 1 AS id');
    const err = await refusal(migrate(url));
    expect(err.message).toMatch(/^outlive: migrate refuses schema outlive: it exists but holds no outlive\.migrations table, so migrate did not make it/);
    expect(err.message).toMatch(/DROP SCHEMA outlive/);
    expect(await one(url, `SELECT to_regclass('outlive.migrations') AS t`)).toEqual({ t: null });
  });

  it('refuses when another role may CREATE in outlive or owns something there, naming the REVOKE, the owner and the ALTER ... OWNER TO; goes on once they are fixed', async () => {
    const { directUrl: url } = await emptyDatabase();
    await migrate(url);
    const other = await createRole('creator');
    await run(url, `GRANT USAGE, CREATE ON SCHEMA outlive TO ${other.name}`);
    await run(other.urlOn(url), `CREATE FUNCTION outlive.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01''::timestamptz'`, 'CREATE TABLE outlive.extra (n int)');
    const err = await refusal(migrate(url));
    expect(err.message).toContain(`role "${other.name}" may CREATE in schema outlive: REVOKE CREATE ON SCHEMA outlive FROM ${other.name}`);
    expect(err.message).toContain(`function outlive.now() is owned by role "${other.name}": ALTER FUNCTION outlive.now() OWNER TO postgres`);
    expect(err.message).toContain(`table outlive.extra is owned by role "${other.name}": ALTER TABLE outlive.extra OWNER TO postgres`);
    await run(url, `REVOKE CREATE ON SCHEMA outlive FROM ${other.name}`, 'DROP FUNCTION outlive.now()', 'ALTER TABLE outlive.extra OWNER TO postgres');
    await migrate(url);
    // PUBLIC counts as another role.
    await run(url, 'GRANT CREATE ON SCHEMA outlive TO PUBLIC');
    expect((await refusal(migrate(url))).message).toContain('every role (PUBLIC) may CREATE in schema outlive: REVOKE CREATE ON SCHEMA outlive FROM PUBLIC');
  });

  it('refuses a trigger on an outlive table that its migrations did not make, or one of theirs calling a function elsewhere', async () => {
    const { directUrl: url } = await emptyDatabase();
    await migrate(url);
    await run(
      url,
      'CREATE FUNCTION public.watch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$',
      'CREATE TRIGGER watch AFTER UPDATE ON outlive.tasks FOR EACH ROW EXECUTE FUNCTION public.watch()',
    );
    let err = await refusal(migrate(url));
    expect(err.message).toContain(`trigger "watch" on outlive.tasks was not made by outlive's migrations: DROP TRIGGER watch ON outlive.tasks`);
    await run(url, 'DROP TRIGGER watch ON outlive.tasks');
    await migrate(url);
    // outlive's own trigger, remade to call a function outside the schema.
    await run(url, 'DROP TRIGGER tasks_notify_insert ON outlive.tasks', 'CREATE TRIGGER tasks_notify_insert AFTER INSERT ON outlive.tasks FOR EACH ROW EXECUTE FUNCTION public.watch()');
    err = await refusal(migrate(url));
    expect(err.message).toContain(`trigger "tasks_notify_insert" on outlive.tasks calls public.watch(), not a function of outlive`);
    // A rule is refused the same way.
    await run(
      url,
      'DROP TRIGGER tasks_notify_insert ON outlive.tasks',
      `CREATE TRIGGER "tasks_notify_insert" AFTER INSERT ON "outlive"."tasks" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION "outlive"."notify_ready"()`,
      'CREATE RULE keep AS ON DELETE TO outlive.runs DO INSTEAD NOTHING',
    );
    err = await refusal(migrate(url));
    expect(err.message).toContain(`rule "keep" on outlive.runs was not made by outlive's migrations: DROP RULE keep ON outlive.runs`);
    await run(url, 'DROP RULE keep ON outlive.runs');
    await migrate(url);
  });

  it('pins its search path: a function earlier on the migrating role’s path does not become the schema’s default', async () => {
    const { directUrl: url } = await emptyDatabase();
    const other = await createRole('pathed');
    await run(url, `GRANT CREATE ON DATABASE ${new URL(url).pathname.slice(1)} TO ${other.name}`);
    await run(
      other.urlOn(url),
      'CREATE SCHEMA lure',
      `CREATE FUNCTION lure.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01''::timestamptz'`,
      'GRANT USAGE ON SCHEMA lure TO PUBLIC',
    );
    const pathed = new URL(url);
    pathed.searchParams.set('options', '-c search_path=lure,pg_catalog,public');
    expect(await one(pathed.toString(), 'SELECT now()::text AS now')).toEqual({ now: '2000-01-01 00:00:00+00' });
    await migrate(pathed.toString());
    const row = await one<{ created_at: Date }>(url, `INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('t', '{}', 1, 1000) RETURNING created_at`);
    expect(Math.abs(row.created_at.getTime() - Date.now())).toBeLessThan(60_000);
    expect(await one(url, `SELECT count(*)::int AS n FROM pg_depend WHERE refobjid = 'lure.now()'::regprocedure`)).toEqual({ n: 0 });
  });

  it('is not held up by another role holding the advisory lock once the schema exists; the first migrate is, and its message escapes the holder’s names', async () => {
    const { directUrl: url } = await emptyDatabase();
    // Role names may hold any character; application_name only printable ASCII on PostgreSQL 15, and more on others.
    const other = await createRole('holder', '\n\u001b[31mFAKE');
    const holder = new pg.Client({ connectionString: other.urlOn(url), application_name: 'app\n\u001b[2Jx' });
    await holder.connect();
    try {
      await holder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
      const err = await refusal(migrate(url, { lockTimeoutMs: 300 }));
      expect(err.message).toMatch(/a session holds the lock \(pid \d+, role "outlive_holder_\d+\\n\\u001b\[31mFAKE", application_name "app[^"]*x"\)/);
      expect(err.message).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/);
      await holder.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
      await migrate(url);
      // With outlive.migrations there, the advisory lock is no longer migrate's.
      await holder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
      await migrate(url, { lockTimeoutMs: 300 });
      // Nor can that role take the table's lock.
      await holder.query('BEGIN');
      await expect(holder.query('LOCK TABLE outlive.migrations IN SHARE ROW EXCLUSIVE MODE')).rejects.toThrow(/permission denied/);
      await holder.query('ROLLBACK');
    } finally {
      await holder.end();
    }
  });
});
