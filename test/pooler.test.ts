/**
 * The path the docs tell users to take: a provider's pooled connection
 * string, which is a transaction pooler. With TEST_POOLER=pgbouncer (CI runs
 * the suite so, through Debian's PgBouncer 1.18, which keeps no prepared
 * statement across transactions) `db.url` goes through it; otherwise it is
 * direct, and the same things must hold there. Default options throughout:
 * a user who pastes a pooled URL should not have to know which pooler it is.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import ws from 'ws';
import { z } from 'zod';
import { defineTask, enqueueMany, neonPool, startRun, step, tick, type TickReport } from '../src/index.js';
import { migrate, MIGRATIONS_FOLDER } from '../src/node/index.js';
import { readMigrations } from '../src/node/migrate.js';
import { emptyDatabase, freshDb } from './support/db.js';
import { migrateUpTo } from './support/migrations.js';
import { startWsProxy } from './support/ws-proxy.js';

const db = await freshDb();
const path = db.pooled ? 'through a transaction pooler' : 'on a direct connection';

describe(`default options ${path}`, () => {
  it('three concurrent migrates and a later one finish; the lock is not left held, so a direct migrate after them finishes too', async () => {
    const target = await emptyDatabase();
    try {
      // Under load: passes of another database keep the pooler's server connections busy meanwhile.
      const busy = defineTask({ name: 'pooler-busy', input: z.object({ i: z.number() }), run: async () => new Promise((r) => setTimeout(r, 5)) });
      await enqueueMany(db.pool, busy, Array.from({ length: 100 }, (_, i) => ({ i })));
      const load = Promise.all([tick(db.pool, { tasks: [busy] }), tick(db.pool, { tasks: [busy] })]);
      await Promise.all([migrate(target.url, { lockTimeoutMs: 20_000 }), migrate(target.url, { lockTimeoutMs: 20_000 }), migrate(target.url, { lockTimeoutMs: 20_000 })]);
      await load;
      await migrate(target.url, { lockTimeoutMs: 5_000 });
      await migrate(target.directUrl, { lockTimeoutMs: 5_000 });
      const check = new pg.Client({ connectionString: target.directUrl });
      await check.connect();
      const { rows } = await check.query<{ n: number }>('SELECT count(*)::int AS n FROM outlive.migrations');
      expect(rows[0]!.n).toBe(readMigrations(MIGRATIONS_FOLDER).length);
      const locks = await check.query(`SELECT pid FROM pg_locks WHERE locktype = 'advisory'`);
      expect(locks.rows).toEqual([]);
      await check.end();
    } finally {
      await target.drop();
    }
  });

  it('three concurrent migrates of a schema some releases behind queue on outlive.migrations: each missing migration is applied once, and no lock is left', async () => {
    const target = await emptyDatabase();
    const check = new pg.Client({ connectionString: target.directUrl });
    await check.connect();
    try {
      await migrateUpTo(check, 8);
      const all = readMigrations(MIGRATIONS_FOLDER);
      const reports = await Promise.all([1, 2, 3].map(() => migrate(target.url, { lockTimeoutMs: 20_000 })));
      expect(reports.map((r) => r.applied.length).sort()).toEqual([0, 0, all.length - 9]);
      const { rows } = await check.query<{ hash: string }>('SELECT hash FROM outlive.migrations ORDER BY id');
      expect(rows.map((r) => r.hash)).toEqual(all.map((m) => m.hash));
      const locks = await check.query(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' OR relation = 'outlive.migrations'::regclass`);
      expect(locks.rows).toEqual([]);
    } finally {
      await check.end();
      await target.drop();
    }
  });

  it('200 tasks run by concurrent passes, on a pg pool and on Neon pools made per invocation, all succeed once; no pass throws', async () => {
    const ran = new Map<string, number>();
    const work = defineTask({
      name: 'pooler-work',
      input: z.object({ i: z.number() }),
      run: async ({ i }, ctx) => {
        ran.set(ctx.taskId, (ran.get(ctx.taskId) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, i % 7));
        return i;
      },
    });
    const tasks = await enqueueMany(db.pool, work, Array.from({ length: 200 }, (_, i) => ({ i })));
    const server = new URL(db.url);
    const proxy = await startWsProxy(`${server.hostname}:${server.port}`);
    const reports: TickReport[] = [];
    try {
      // A Neon pool per invocation, as a Worker makes one per event, with claims of a few tasks so passes overlap.
      const invocation = async () => {
        const pool = neonPool({ connectionString: db.url, wsProxy: proxy.address, webSocketConstructor: ws });
        try {
          reports.push(await tick(pool, { tasks: [work], concurrency: 4, prefetch: 0, maxTasks: 20 }));
        } finally {
          await pool.end();
        }
      };
      const onPg = async () => reports.push(await tick(db.pool, { tasks: [work], concurrency: 5, prefetch: 0, maxTasks: 30 }));
      for (let round = 0; round < 10; round++) {
        await Promise.all([invocation(), invocation(), onPg(), onPg()]);
        const [left] = await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE name = 'pooler-work' AND state <> 'succeeded'`);
        if (left!.n === 0) break;
      }
    } finally {
      await proxy.close();
    }
    const rows = await db.rows<{ state: string; attempts: number }>(`SELECT state::text, attempts FROM outlive.tasks WHERE id = ANY($1::bigint[])`, [tasks.map((t) => t.id)]);
    expect(rows).toHaveLength(200);
    expect(rows.every((r) => r.state === 'succeeded' && r.attempts === 1)).toBe(true);
    expect([...ran.values()].every((n) => n === 1)).toBe(true);
    expect(reports.reduce((sum, r) => sum + r.succeeded, 0)).toBe(200);
    expect(reports.reduce((sum, r) => sum + r.lostLeases + r.failed + r.retried, 0)).toBe(0);
  });

  it('a crawl that spawns 30 pages and a final step after all of them succeeds, page by page in parallel passes', async () => {
    const page = defineTask({ name: 'pooler-page', input: z.object({ n: z.number() }), run: async ({ n }) => ({ n }) });
    const finish = defineTask({
      name: 'pooler-finish',
      input: z.object({}),
      run: async (_input, ctx) => Object.keys(await ctx.outputs()).length,
    });
    const crawl = defineTask({
      name: 'pooler-crawl',
      input: z.object({ pages: z.number() }),
      run: ({ pages }, ctx) => {
        const names = Array.from({ length: pages }, (_, n) => `page:${n}`);
        names.forEach((name, n) => ctx.spawn(name, step(page, { n })));
        ctx.spawn('finish', step(finish, {}, { after: names }));
        return { pages };
      },
    });
    const run = await startRun(db.pool, 'crawl through the path', { crawl: step(crawl, { pages: 30 }) });
    const tasks = [crawl, page, finish];
    for (let round = 0; round < 20; round++) {
      await Promise.all([tick(db.pool, { tasks, concurrency: 4, prefetch: 0 }), tick(db.pool, { tasks, concurrency: 4, prefetch: 0 })]);
      const [r] = await db.rows<{ state: string }>(`SELECT state::text FROM outlive.runs WHERE id = $1`, [run.id]);
      if (r!.state !== 'running') break;
    }
    const [r] = await db.rows<{ state: string; unfinished: number }>(`SELECT state::text, unfinished FROM outlive.runs WHERE id = $1`, [run.id]);
    expect(r).toEqual({ state: 'succeeded', unfinished: 0 });
    const steps = await db.rows<{ state: string; n: number }>(`SELECT state::text, count(*)::int AS n FROM outlive.tasks WHERE run_id = $1 GROUP BY 1`, [run.id]);
    expect(steps).toEqual([{ state: 'succeeded', n: 32 }]);
    const [fin] = await db.rows<{ output: unknown }>(`SELECT output FROM outlive.tasks WHERE run_id = $1 AND step = 'finish'`, [run.id]);
    expect(fin!.output).toBe(30);
  });
});
