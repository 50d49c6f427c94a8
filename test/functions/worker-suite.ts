/**
 * The Cloudflare Worker, bundled and run in Miniflare (workerd), against the
 * real PostgreSQL: one suite, run once per way a Worker reaches the database
 * (`worker.hyperdrive.test.ts`: node-postgres through a Hyperdrive binding;
 * `worker.neon.test.ts`: Neon's WebSocket driver, no `nodejs_compat`). A
 * pass must behave the same either way.
 */
import { readFileSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { enqueue } from '../../src/write/enqueue.js';
import { CPU_MS_DEFAULT, hourOrMoreApart, workerBudgetMs, workerLimitMs } from '../../src/http/cloudflare.js';
import { nudge, signNudge, SIGNATURE_HEADER } from '../../src/http/nudge.js';
import { freshDb } from '../support/db.js';
import { definitions } from '../support/function-tasks.js';
import { roleUrl, waitFor } from '../support/functions-db.js';
import { createEffects, taskRow } from '../support/tasks.js';
import { startTcpProxy } from '../support/tcp-proxy.js';
import { bundleWorker, COMPATIBILITY_DATE, startWorker, workerDatabase, type RunningWorker, type WorkerVia } from '../support/worker.js';

/** Declares the suite for one way of reaching the database; call it at the top level of a test file. */
export async function workerSuite(via: WorkerVia): Promise<void> {
  const db = await freshDb();
  await createEffects(db.pool);
  const { url: databaseUrl, password } = await roleUrl(db);
  const database = await workerDatabase(via, databaseUrl);
  const script = await bundleWorker('test/support/function-tasks.ts', database.entry);
  const SECRET = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
  const defs = definitions(null);

  const workers: RunningWorker[] = [];
  /** Every response body the tests saw, to search for secrets at the end. */
  const bodies: string[] = [];

  async function worker(extra: Record<string, string> = {}, reach = database): Promise<RunningWorker> {
    const w = await startWorker(script, { ...reach.bindings, OUTLIVE_DRAIN_SECRET: SECRET, ...extra }, reach.options);
    workers.push(w);
    return w;
  }

  afterAll(async () => {
    for (const w of workers) await w.dispose();
    await database.close();
  });

  const main = await worker({ OUTLIVE_BUDGET_MS: '8000' });

  async function text(response: Response): Promise<{ status: number; body: string; json: any }> {
    const body = await response.text();
    bodies.push(body);
    let parsed: unknown = null;
    try {
      parsed = JSON.parse(body);
    } catch {
      // not JSON
    }
    return { status: response.status, body, json: parsed };
  }

  async function drain(w: RunningWorker, body = '', headers: Record<string, string> = {}, signature?: string) {
    const sig = signature ?? (await signNudge(SECRET, w.url('/drain'), body));
    return text(await w.fetch('/drain', { method: 'POST', headers: { [SIGNATURE_HEADER]: sig, ...headers }, body }));
  }

  async function record(n: number, options: { sleepMs?: number } = {}) {
    return enqueue(db.pool, defs.record, options.sleepMs === undefined ? { n } : { n, sleepMs: options.sleepMs });
  }

  async function effectsOf(ids: string[]): Promise<Record<string, string[]>> {
    const rows = await db.rows<{ task_id: string; label: string }>(
      `SELECT task_id::text, label FROM effects WHERE task_id = ANY($1::bigint[]) ORDER BY at`,
      [ids],
    );
    const out: Record<string, string[]> = {};
    for (const r of rows) (out[r.task_id] ??= []).push(r.label);
    return out;
  }

  async function states(ids: string[]): Promise<Record<string, number>> {
    const rows = await db.rows<{ state: string; n: number }>(
      `SELECT state::text, count(*)::int AS n FROM outlive.tasks WHERE id = ANY($1::bigint[]) GROUP BY state`,
      [ids],
    );
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }

  describe('the drain webhook (POST /drain)', () => {
    it('runs an enqueued task before it answers, when the request is signed', async () => {
      const t = await record(1);
      const res = await drain(main);
      expect(res.status).toBe(200);
      expect(res.json.report).toMatchObject({ claimed: 1, succeeded: 1, failed: 0 });
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded', attempts: 1, output: { n: 1 } });
      expect(await effectsOf([t.id])).toEqual({ [t.id]: ['1'] });
      // The pass went through the driver this suite is about.
      expect(main.output()).toMatch(via === 'hyperdrive' ? /"outlive":"pass".*"driver":"pg"/ : /"outlive":"pass".*"driver":"neon"/);
      // Closing the invocation's pool is no error: nothing to log when all went well.
      await waitFor(async () => database.open === 0, 20_000, 'the pool to close');
      expect(main.output()).not.toMatch(/"outlive":"(pool-error|pool-end-error|background-error)"/);
    });

    it('answers a nudge at once (202) and runs the pass in waitUntil, then closes its pool', async () => {
      const t = await record(2);
      const result = await nudge(main.url('/drain'), SECRET);
      expect(result).toEqual({ delivered: true, status: 202 });
      const row = await waitFor(async () => {
        const r = await taskRow(db.pool, t.id);
        return r.state === 'succeeded' ? r : undefined;
      }, 20_000, 'the nudged task to succeed');
      expect(row.attempts).toBe(1);
      // The invocation's pool is closed through waitUntil: its connections go away.
      await waitFor(async () => database.open === 0, 20_000, 'the pool to close');
    });

    it('refuses missing, malformed, wrong, tampered, stale and future signatures with 401 and runs nothing', async () => {
      const t = await record(3);
      const nonces = async () => (await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.used_nonces`))[0]!.n;
      const noncesBefore = await nonces();
      const body = '{"queues":["default"]}';
      const attempts: [string, Promise<{ status: number; json: any }>][] = [
        ['unsigned', text(await main.fetch('/drain', { method: 'POST', body }))],
        ['malformed', drain(main, body, {}, 't=abc,n=x,v1=zz')],
        ['wrong secret', drain(main, body, {}, await signNudge('x'.repeat(64), main.url('/drain'), body))],
        ['tampered body', drain(main, '{"queues":["other"]}', {}, await signNudge(SECRET, main.url('/drain'), body))],
        ['stale', drain(main, body, {}, await signNudge(SECRET, main.url('/drain'), body, { now: new Date(Date.now() - 10 * 60_000) }))],
        ['future', drain(main, body, {}, await signNudge(SECRET, main.url('/drain'), body, { now: new Date(Date.now() + 10 * 60_000) }))],
      ];
      for (const [what, attempt] of attempts) {
        const res = await attempt;
        expect({ what, status: res.status }).toEqual({ what, status: 401 });
        expect(typeof res.json.error).toBe('string');
      }
      // Refused before any pass was started, so nothing ran and nothing will.
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'pending', attempts: 0 });
      expect(await nonces()).toBe(noncesBefore); // refused before the nonce was spent

      // A signed request now drains it (the refusals did not poison anything).
      const ok = await drain(main, body);
      expect(ok.status).toBe(200);
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded' });
    });

    it("logs no pool error for a handler's failed query: the pool ends that client itself", async () => {
      const t = await enqueue(db.pool, defs.failedQuery, {});
      const res = await drain(main);
      expect(res.json.report).toMatchObject({ claimed: 1, succeeded: 1 });
      expect(await effectsOf([t.id])).toEqual({ [t.id]: ['query failed'] });
      await waitFor(async () => database.open === 0, 20_000, 'the pool to close');
      expect(main.output()).not.toMatch(/"outlive":"(pool-error|pool-end-error|background-error)"/);
    });

    it('refuses a replayed request with 403 and runs nothing', async () => {
      const first = await record(4);
      const signature = await signNudge(SECRET, main.url('/drain'), '');
      const accepted = await drain(main, '', {}, signature);
      expect(accepted.status).toBe(200);
      expect(await taskRow(db.pool, first.id)).toMatchObject({ state: 'succeeded' });

      const second = await record(5);
      const replayed = await drain(main, '', {}, signature);
      expect(replayed.status).toBe(403);
      expect(replayed.json.error).toMatch(/already used/);
      expect(await taskRow(db.pool, second.id)).toMatchObject({ state: 'pending', attempts: 0 });
      // Two replays racing each other: both refused.
      const [a, b] = await Promise.all([drain(main, '', {}, signature), drain(main, '', {}, signature)]);
      expect([a.status, b.status]).toEqual([403, 403]);
      expect(await taskRow(db.pool, second.id)).toMatchObject({ state: 'pending', attempts: 0 });
      await drain(main);
    });

    it('does not claim a task whose timeout does not fit in the budget', async () => {
      const long = await enqueue(db.pool, defs.long, {});
      const short = await record(6);
      const res = await drain(main);
      expect(res.status).toBe(200);
      expect(res.json.report).toMatchObject({ claimed: 1, succeeded: 1 });
      expect(await taskRow(db.pool, short.id)).toMatchObject({ state: 'succeeded' });
      expect(await taskRow(db.pool, long.id)).toMatchObject({ state: 'pending', attempts: 0, started_at: null });
      await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', finished_at = now() WHERE id = $1`, [long.id]);
    });

    it('runs two concurrent drains over disjoint tasks: every task once', async () => {
      const tasks = await Promise.all(Array.from({ length: 30 }, (_, i) => record(100 + i, { sleepMs: 20 })));
      const ids = tasks.map((t) => t.id);
      const [a, b] = await Promise.all([drain(main), drain(main)]);
      expect([a.status, b.status]).toEqual([200, 200]);
      expect(a.json.report.claimed + b.json.report.claimed).toBe(30);
      expect(await states(ids)).toEqual({ succeeded: 30 });
      const effects = await effectsOf(ids);
      expect(Object.keys(effects)).toHaveLength(30);
      for (const id of ids) expect(effects[id]).toHaveLength(1);
    });

    it('answers 404 elsewhere and 405 to other methods', async () => {
      expect((await text(await main.fetch('/other', { method: 'POST' }))).status).toBe(404);
      expect((await text(await main.fetch('/drainage', { method: 'POST' }))).status).toBe(404);
      expect((await text(await main.fetch('/drain'))).status).toBe(405);
    });

    // The signature treats /drain and /drain/ as one endpoint (platforms
    // redirect between them); the route did not, and answered 404.
    it('serves /drain/ as /drain: a nudge to it is delivered and its task runs', async () => {
      const t = await record(3);
      expect(await nudge(main.url('/drain/'), SECRET)).toEqual({ delivered: true, status: 202 });
      await waitFor(async () => (await taskRow(db.pool, t.id)).state === 'succeeded', 20_000, 'the task nudged at /drain/ to succeed');
    });
  });

  describe('the cron trigger (scheduled)', () => {
    it('recovers an expired lease, then runs a pass', async () => {
      const dead = await record(200);
      // A pass that died mid-task: running, lease expired.
      await db.pool.query(
        `UPDATE outlive.tasks SET state = 'running', attempts = 1, lease_owner = 'dead-pass',
           started_at = now() - interval '1 minute', lease_expires_at = now() - interval '1 second' WHERE id = $1`,
        [dead.id],
      );
      const ready = await record(201);
      const { outcome } = await main.scheduled();
      expect(outcome).toBe('ok');
      expect(await taskRow(db.pool, ready.id)).toMatchObject({ state: 'succeeded' });
      const recovered = await taskRow(db.pool, dead.id);
      expect(recovered).toMatchObject({ state: 'pending', lease_owner: null, attempts: 1 });
      expect(recovered.errors.at(-1)).toMatchObject({ name: 'LeaseExpired', attempt: 1 });
      // Its backoff over, the next tick runs it.
      await db.pool.query(`UPDATE outlive.tasks SET run_at = now() WHERE id = $1`, [dead.id]);
      await main.scheduled();
      expect(await taskRow(db.pool, dead.id)).toMatchObject({ state: 'succeeded', attempts: 2 });
      expect(main.output()).toMatch(/"outlive":"pass".*"trigger":"cron"/);
    });

    it('drains a backlog across several bounded passes', async () => {
      // Budget 3 s, less 250 ms kept for the last settles: a task (timeout 1 s)
      // is claimed only in the first 1.75 s of a pass, so a pass of 2 handlers
      // at 200 ms each takes at most 18 of the 40 tasks.
      const small = await worker({ OUTLIVE_BUDGET_MS: '3000', OUTLIVE_CONCURRENCY: '2' });
      const ids = (await Promise.all(Array.from({ length: 40 }, (_, i) => enqueue(db.pool, defs.quick, { n: 300 + i, sleepMs: 200 })))).map(
        (t) => t.id,
      );
      expect((await small.scheduled()).outcome).toBe('ok');
      expect((await states(ids)).pending).toBeGreaterThan(0);
      let passes = 1;
      while ((await states(ids)).succeeded !== ids.length && passes < 40) {
        expect((await small.scheduled()).outcome).toBe('ok');
        passes++;
      }
      expect(passes).toBeGreaterThanOrEqual(3);
      expect(await states(ids)).toEqual({ succeeded: 40 });
      const effects = await effectsOf(ids);
      for (const id of ids) expect(effects[id]).toHaveLength(1);
      const reports = small
        .output()
        .split('\n')
        .filter((line) => line.includes('"outlive":"pass"'))
        .map((line) => JSON.parse(line));
      expect(reports).toHaveLength(passes);
      // No pass took more than its budget lets it claim.
      for (const r of reports) expect(r.claimed).toBeLessThanOrEqual(18);
      expect(reports.reduce((sum, r) => sum + r.succeeded, 0)).toBe(40);
      await small.dispose();
    }, 90_000);

    it('runs two overlapping scheduled events over disjoint tasks: every task once', async () => {
      const ids = (await Promise.all(Array.from({ length: 30 }, (_, i) => record(400 + i, { sleepMs: 20 })))).map((t) => t.id);
      const other = await worker({ OUTLIVE_BUDGET_MS: '8000' });
      const outcomes = await Promise.all([main.scheduled(), other.scheduled()]);
      expect(outcomes.map((o) => o.outcome)).toEqual(['ok', 'ok']);
      expect(await states(ids)).toEqual({ succeeded: 30 });
      const effects = await effectsOf(ids);
      for (const id of ids) expect(effects[id]).toHaveLength(1);
      await other.dispose();
    }, 60_000);

    it('leaves a lease that the next tick recovers when the Worker dies mid-task', async () => {
      const doomed = await worker({ OUTLIVE_BUDGET_MS: '15000' });
      const t = await enqueue(db.pool, defs.hang, {});
      const event = doomed.scheduled().catch((err: unknown) => err);
      await waitFor(async () => (await effectsOf([t.id]))[t.id]?.includes('started'), 20_000, 'the handler to start');
      await doomed.dispose(); // workerd is killed while the handler hangs
      await event;
      const orphan = await taskRow(db.pool, t.id);
      expect(orphan).toMatchObject({ state: 'running', attempts: 1 });
      expect(orphan.lease_owner).toMatch(/^cloudflare:cron:/);

      // Time passes (the lease is backdated rather than waited for).
      await db.pool.query(`UPDATE outlive.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, [t.id]);
      const next = await worker({ OUTLIVE_BUDGET_MS: '15000' });
      await next.scheduled();
      const recovered = await taskRow(db.pool, t.id);
      expect(recovered).toMatchObject({ state: 'pending', attempts: 1, lease_owner: null });
      expect(recovered.errors.at(-1)).toMatchObject({ name: 'LeaseExpired' });
      await db.pool.query(`UPDATE outlive.tasks SET run_at = now() WHERE id = $1`, [t.id]);
      await next.scheduled();
      expect(await taskRow(db.pool, t.id)).toMatchObject({ state: 'succeeded', attempts: 2 });
      expect((await effectsOf([t.id]))[t.id]).toEqual(['started', 'attempt-2']);
      await next.dispose();
    }, 60_000);
  });

  describe('the budget of each event, from the limits Cloudflare documents', () => {
    const cron = (expression: string) => ({ trigger: 'cron', cron: expression }) as const;
    const drainIn = (background: boolean) => ({ trigger: 'drain', background }) as const;

    it('gives a cron tick under an hour apart 25 s: its CPU limit is 30 s, whatever cpu_ms says', () => {
      for (const expression of ['* * * * *', '*/5 * * * *', '0,30 * * * *', '15-20 * * * *']) {
        for (const cpuMs of [undefined, 30_000, 300_000]) {
          expect({ expression, cpuMs, budget: workerBudgetMs(cron(expression), cpuMs) }).toEqual({ expression, cpuMs, budget: 25_000 });
        }
      }
    });

    it('lets a tick an hour or more apart run up to the configured cpu_ms (its own limits are 15 min of CPU and of wall time)', () => {
      expect(workerBudgetMs(cron('0 * * * *'))).toBe(25_000); // cpu_ms as wrangler.toml sets it, 30 s
      expect(workerBudgetMs(cron('30 3 * * *'), 120_000)).toBe(108_000);
      expect(workerBudgetMs(cron('0 */6 * * *'), 300_000)).toBe(270_000);
      expect(workerLimitMs(cron('0 * * * *'), 300_000)).toBe(300_000);
    });

    it('gives a drain in waitUntil 25 s: its work is cut 30 s after the response, whatever cpu_ms says', () => {
      for (const cpuMs of [undefined, 30_000, 300_000]) expect(workerBudgetMs(drainIn(true), cpuMs)).toBe(25_000);
      expect(workerBudgetMs(drainIn(true), 10_000)).toBe(5_000); // a lower cpu_ms bounds it too
    });

    it('gives a drain whose caller waits the configured cpu_ms, less a tenth: its wall time is unlimited while the caller is connected', () => {
      expect(workerBudgetMs(drainIn(false))).toBe(25_000);
      expect(workerBudgetMs(drainIn(false), 300_000)).toBe(270_000);
    });

    it('reads a cron as an hour or more apart only when its minute is one number', () => {
      for (const expression of ['0 * * * *', '59 23 LW * *', '0 17 * * sun', ' 5  */2 * * * ']) expect(hourOrMoreApart(expression)).toBe(true);
      for (const expression of ['* * * * *', '*/30 * * * *', '0,30 * * * *', '0-1 * * * *', '60 * * * *', 'x * * * *', '0 * * *', '']) {
        expect({ expression, hourly: hourOrMoreApart(expression) }).toEqual({ expression, hourly: false });
      }
    });

    it('assumes the cpu_ms wrangler.toml sets, which makes a deploy on the Free plan fail rather than its passes', () => {
      const toml = readFileSync(new URL('../../wrangler.toml', import.meta.url), 'utf8');
      const limits = /^\[limits\]\s*\n(?:#.*\n|\s*\n)*cpu_ms\s*=\s*([\d_]+)/m.exec(toml);
      expect(limits, 'wrangler.toml sets [limits] cpu_ms').not.toBeNull();
      expect(Number(limits![1]!.replace(/_/g, ''))).toBe(CPU_MS_DEFAULT);
      expect(toml).toContain(`compatibility_date = "${COMPATIBILITY_DATE}"`);
    });

    /** The passes a Worker logged, in order: why each ran and its budget. */
    const passes = (w: RunningWorker) =>
      w
        .output()
        .split('\n')
        .filter((line) => line.includes('"outlive":"pass"'))
        .map((line) => JSON.parse(line) as { trigger: string; budgetMs: number })
        .map(({ trigger, budgetMs }) => ({ trigger, budgetMs }));

    it('is what each event gets in workerd: the cron by its schedule, the drain by how it answers, both by OUTLIVE_CPU_MS', async () => {
      const w = await worker({ OUTLIVE_CPU_MS: '120000' });
      expect((await w.scheduled('* * * * *')).outcome).toBe('ok');
      expect((await w.scheduled('0 * * * *')).outcome).toBe('ok');
      expect((await drain(w)).status).toBe(200);
      expect(await nudge(w.url('/drain'), SECRET)).toEqual({ delivered: true, status: 202 });
      await waitFor(async () => passes(w).length === 4, 20_000, 'the nudged pass');
      expect(passes(w)).toEqual([
        { trigger: 'cron', budgetMs: 25_000 },
        { trigger: 'cron', budgetMs: 108_000 },
        { trigger: 'drain', budgetMs: 108_000 },
        { trigger: 'drain', budgetMs: 25_000 },
      ]);
      await w.dispose();
    });

    it('may be lowered by OUTLIVE_BUDGET_MS, never raised', async () => {
      const lower = await worker({ OUTLIVE_BUDGET_MS: '4000', OUTLIVE_CPU_MS: '120000' });
      expect((await lower.scheduled('0 * * * *')).outcome).toBe('ok');
      expect((await drain(lower)).status).toBe(200);
      expect(passes(lower)).toEqual([
        { trigger: 'cron', budgetMs: 4_000 },
        { trigger: 'drain', budgetMs: 4_000 },
      ]);
      const higher = await worker({ OUTLIVE_BUDGET_MS: '600000' });
      expect((await higher.scheduled('0 * * * *')).outcome).toBe('ok');
      expect(passes(higher)).toEqual([{ trigger: 'cron', budgetMs: 25_000 }]);
      expect(higher.output()).toMatch(/"outlive":"budget-capped".*"requestedMs":600000,"budgetMs":25000/);
      await lower.dispose();
      await higher.dispose();
    });

    it('refuses an OUTLIVE_CPU_MS that Cloudflare would not accept as cpu_ms, naming the setting', async () => {
      for (const value of ['300001', 'abc', '0']) {
        const w = await worker({ OUTLIVE_CPU_MS: value });
        expect({ value, status: (await drain(w)).status }).toEqual({ value, status: 500 });
        expect((await w.scheduled()).outcome).not.toBe('ok');
        await waitFor(async () => w.output().includes('OUTLIVE_CPU_MS'), 10_000, 'the setting to be named');
        await w.dispose();
      }
    });
  });

  describe('connections that fail', () => {
    it('are logged as short lines that say what happened, never as a client, a cancel key or a secret', async () => {
      const w = await worker({ OUTLIVE_BUDGET_MS: '8000', OUTLIVE_CONCURRENCY: '4' });
      const from = w.output().length;
      // Handlers that sleep hold the pool's connections; killing the role's
      // backends meanwhile breaks connections in use and idle ones.
      await Promise.all([1, 2, 3].map((i) => record(900 + i, { sleepMs: 1_500 })));
      const draining = drain(w);
      await waitFor(async () => (await db.rows(`SELECT 1 FROM outlive.tasks WHERE state = 'running'`)).length > 0, 10_000, 'a claim');
      const role = new URL(databaseUrl).username;
      await db.pool.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, [role]);
      bodies.push((await draining).body);
      await waitFor(async () => /pass-failed|pool-error|"outlive":"pass"/.test(w.output().slice(from)), 10_000, 'the pass to end');
      // A server that hangs up at once, too.
      const nowhere = await startTcpProxy('127.0.0.1', 1);
      const unreachable = await worker({}, { ...database, ...database.forUrl(nowhere.url(databaseUrl), true) });
      bodies.push((await drain(unreachable)).body);
      await waitFor(async () => /pass-failed|drain-verify-error/.test(unreachable.output()), 20_000, 'the unreachable database to be logged');

      const lines = [w.output().slice(from), unreachable.output()].join('\n').split('\n').filter((l) => l.includes('"outlive":'));
      const failures = lines.filter((l) => /"outlive":"(pass-failed|pool-error|drain-verify-error|background-error)"/.test(l));
      expect(failures.length, lines.join('\n')).toBeGreaterThan(0);
      for (const line of failures) {
        expect(line.length, line).toBeLessThan(1_000);
        expect(line, line).not.toMatch(/secretKey|processID|non-Error thrown: \{|"error":""|"error":"\{\}"/);
        expect(JSON.parse(line).error ?? '', line).toMatch(/[a-z]{3,}/i);
      }
      for (const secret of [SECRET, password, databaseUrl]) expect(lines.join('\n').includes(secret)).toBe(false);
      await nowhere.close();
      if (process.env.SHOW_FAILURE_LINES) console.log(failures.join('\n'));
    }, 60_000);
  });

  describe('secrets', () => {
    it('never appear in a response or a log line, even when a pass fails', async () => {
      // A database that does not exist: the pass fails and logs why.
      const broken = new URL(databaseUrl);
      broken.pathname = '/no_such_database';
      const failing = await worker({ CRON_SECRET: 'cron-' + SECRET.slice(0, 24) }, { ...database, ...database.forUrl(broken.toString()) });
      const event = await failing.scheduled().catch((err: unknown) => ({ outcome: String(err) }));
      expect(event.outcome).not.toBe('ok');
      bodies.push(event.outcome);
      bodies.push((await drain(failing)).body);
      await waitFor(async () => /pass-failed|drain-verify-error/.test(failing.output()), 10_000, 'the failure to be logged');

      const everything = [...workers.map((w) => w.output()), ...bodies].join('\n');
      expect(everything).toMatch(/"outlive":"pass"/); // the logs are there to search
      expect(everything).toMatch(/no_such_database/); // and they do say what went wrong
      for (const secret of [SECRET, password, databaseUrl, 'cron-' + SECRET.slice(0, 24)]) {
        expect(everything.includes(secret)).toBe(false);
      }
    });
  });
}
