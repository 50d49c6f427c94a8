import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineSchedule, defineTask, enqueue, type TickReport } from '../src/index.js';
import { createWorker, type Worker, type WorkerLogger } from '../src/node/index.js';
import { freshDb, type TestDb } from './support/db.js';
import { startPoolerLikeProxy } from './support/pooler-like-proxy.js';
import { createFixtureTables } from './fixtures/worker-tasks.js';

const db = await freshDb();
await createFixtureTables(db.pool);

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Waits until `check` returns something truthy; the test's timeout bounds the wait. */
async function until<T>(check: () => Promise<T | undefined | null | false>, everyMs = 20): Promise<T> {
  for (;;) {
    const value = await check();
    if (value) return value;
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

async function effect(label: string, on: TestDb = db): Promise<{ label: string; pid: number } | undefined> {
  const [row] = await on.rows<{ label: string; pid: number }>('SELECT label, pid FROM worker_effects WHERE label = $1', [label]);
  return row;
}

/** Enqueues and commits one task on its own connection. */
async function enqueueCommitted(task: Parameters<typeof enqueue>[1], input: unknown, on: TestDb = db): Promise<string> {
  const client = await on.pool.connect();
  try {
    await client.query('BEGIN');
    const row = await enqueue(client, task, input as never);
    await client.query('COMMIT');
    return row.id;
  } finally {
    client.release();
  }
}

// The same definitions the child process loads, for typing the enqueues here.
const { recordLabel, gated } = await import('./fixtures/worker-tasks.js');

// In this process a task named like the fixture's, which only has to succeed: its row says it ran.
const ownRecord = defineTask({
  name: 'child-record',
  input: z.object({ label: z.string() }),
  async run() {
    return null;
  },
});

async function enqueueCommittedOwn(own: TestDb, label: string): Promise<void> {
  await enqueueCommitted(ownRecord, { label }, own);
}

async function effectOwn(own: TestDb, label: string): Promise<boolean> {
  const rows = await own.rows(`SELECT 1 FROM outlive.tasks WHERE name = 'child-record' AND input ->> 'label' = $1 AND state = 'succeeded'`, [label]);
  return rows.length === 1;
}


/** A worker run by the CLI in a child process, with its output read line by line. */
class ChildWorker {
  readonly proc: ChildProcess;
  readonly lines: string[] = [];
  private waiters: { re: RegExp; resolve: (line: string) => void }[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(url: string, extraArgs: string[] = []) {
    this.proc = spawn(
      process.execPath,
      ['--conditions=outlive-source', '--import', 'tsx', 'bin/outlive.js', 'worker', '--database-url', url, '--tasks', 'test/fixtures/worker-tasks.ts', '--no-retention', ...extraArgs],
      { cwd: ROOT, env: { ...process.env, DATABASE_URL: url }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const onData = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (!line) continue;
        this.lines.push(line);
        this.waiters = this.waiters.filter((w) => {
          if (!w.re.test(line)) return true;
          w.resolve(line);
          return false;
        });
      }
    };
    this.proc.stdout!.on('data', onData);
    this.proc.stderr!.on('data', onData);
    this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })));
  }

  /** Resolves with the first line (past or future) matching `re`. */
  waitFor(re: RegExp): Promise<string> {
    const seen = this.lines.find((l) => re.test(l));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => this.waiters.push({ re, resolve }));
  }

  /** Kills the child if it is still running (the one this test started, by its pid). */
  kill(): void {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
  }
}

const children: ChildWorker[] = [];
afterAll(() => children.forEach((c) => c.kill()));

function startChild(extraArgs: string[] = []): ChildWorker {
  // Through a transaction pooler, LISTEN needs the direct URL (the documented fix).
  const child = new ChildWorker(db.url, [...(db.pooled ? ['--listen-database-url', db.directUrl] : []), ...extraArgs]);
  children.push(child);
  return child;
}

describe('the worker in a child process (outlive worker)', () => {
  it('runs a task after its enqueue commits, and not before', async () => {
    // Polling is set far beyond the test's timeout: only a notification can wake it in time.
    const child = startChild(['--poll-interval-ms', '600000']);
    await child.waitFor(/outlive worker: started \(listening on "outlive"/);

    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await enqueue(client, recordLabel, { label: 'uncommitted' });
      // Another task, committed: once it has run, the worker has been woken and
      // has claimed everything it could see; the open transaction's row was not.
      await enqueueCommitted(recordLabel, { label: 'witness' });
      await until(() => effect('witness'));
      expect(await effect('uncommitted')).toBeUndefined();
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const ran = await until(() => effect('uncommitted'));
    expect(ran.pid).toBe(child.proc.pid);
    child.proc.kill('SIGTERM');
    expect(await child.exited).toEqual({ code: 0, signal: null });
  });

  it('on SIGTERM stops claiming, lets the running task finish, and exits 0', async () => {
    const child = startChild(['--poll-interval-ms', '600000', '--grace-ms', '60000']);
    await child.waitFor(/outlive worker: started/);
    const id = await enqueueCommitted(gated, { label: 'slow' });
    await until(() => effect('started:slow'));

    child.proc.kill('SIGTERM');
    await child.waitFor(/SIGTERM received: stopping/);
    await child.waitFor(/waiting up to \d+ ms for running tasks/);
    // The task is still running under the stopping worker; now let it finish.
    expect((await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [id]))[0]).toEqual({ state: 'running' });
    await db.pool.query(`INSERT INTO worker_gates (label) VALUES ('slow')`);

    expect(await child.exited).toEqual({ code: 0, signal: null });
    expect(await effect('finished:slow')).toBeDefined();
    expect(await db.rows(`SELECT state::text, lease_owner FROM outlive.tasks WHERE id = $1`, [id])).toEqual([{ state: 'succeeded', lease_owner: null }]);
    expect(child.lines).toContain('outlive worker: stopped');
  });

  it('fails to start with one clear line when the database is not there', async () => {
    const bad = db.url.replace(/\/[^/]+$/, '/outlive_no_such_database');
    const child = startChild(['--database-url', bad]);
    const { code } = await child.exited;
    expect(code).toBe(1);
    const errors = child.lines.filter((l) => l.startsWith('outlive:'));
    expect(errors).toEqual([expect.stringMatching(/^outlive: the worker cannot connect to the database: .*outlive_no_such_database/)]);
    expect(child.lines.some((l) => /^\s+at /.test(l))).toBe(false);
  });
});

/** Collects log lines in memory. */
function memoryLog(): WorkerLogger & { lines: string[]; waitFor(re: RegExp): Promise<void> } {
  const lines: string[] = [];
  const waiters: { re: RegExp; resolve: () => void }[] = [];
  const push = (l: string) => {
    lines.push(l);
    for (const w of waiters.splice(0)) {
      if (w.re.test(l)) w.resolve();
      else waiters.push(w);
    }
  };
  return {
    lines,
    info: push,
    warn: push,
    error: push,
    waitFor: (re) => (lines.some((l) => re.test(l)) ? Promise.resolve() : new Promise((resolve) => waiters.push({ re, resolve }))),
  };
}

describe('the worker in this process (createWorker)', () => {
  const workers: Worker[] = [];
  afterAll(() => Promise.all(workers.map((w) => w.stop({ graceMs: 0 }))));

  it('blanks its connection string, and the secrets it is given, out of the errors it stores in rows and out of its log', async () => {
    const API_KEY = `sk-${crypto.randomUUID()}`;
    const leaky = defineTask({
      name: 'worker-leaky',
      input: z.object({}),
      retry: { maxAttempts: 1 },
      async run() {
        throw new Error(`cannot reach ${db.url} with ${API_KEY}`);
      },
    });
    const log = memoryLog();
    const worker = createWorker({
      connectionString: db.url, tasks: [leaky], secrets: [API_KEY], pollIntervalMs: 200, retention: false, logger: log,
      onPass: (r) => {
        if (r.failed > 0) throw new Error(`report to ${db.url} with ${API_KEY} failed`);
      },
    });
    workers.push(worker);
    const id = await enqueueCommitted(leaky, {});
    await worker.start();
    const [row] = await until(async () => {
      const rows = await db.rows<{ last_error: string; errors: unknown }>(`SELECT last_error, errors FROM outlive.tasks WHERE id = $1 AND state = 'failed'`, [id]);
      return rows.length > 0 ? rows : null;
    });
    expect(row!.last_error).toBe('cannot reach [redacted] with [redacted]');
    const stored = JSON.stringify(row);
    for (const secret of [db.url, API_KEY]) expect(stored.includes(secret)).toBe(false);
    // Its log blanks them too (an onPass that threw, quoting them).
    await log.waitFor(/onPass threw: report to \[redacted\] with \[redacted\] failed/);
    for (const secret of [db.url, API_KEY]) expect(log.lines.join('\n').includes(secret)).toBe(false);
    await worker.stop({ graceMs: 0 });
  });

  // Through a transaction pooler LISTEN is accepted and no notification ever
  // arrives: the worker used to log "listening" and start tasks only by polling.
  it('proves its LISTEN connection receives, and through one that cannot, warns once with the fix and polls', async () => {
    const own = await freshDb();
    const target = new URL(own.directUrl);
    // The suite's PgBouncer where it runs through one; else a proxy that drops notifications as a pooler does.
    const pooler = own.pooled ? null : await startPoolerLikeProxy(target.hostname, Number(target.port || 5432));
    const pooledUrl = pooler ? pooler.url(own.url) : own.url;
    try {
      const log = memoryLog();
      const worker = createWorker({ connectionString: pooledUrl, tasks: [ownRecord], pollIntervalMs: 300, retention: false, logger: log });
      workers.push(worker);
      await worker.start();
      expect(log.lines.filter((l) => /did not receive the notification the worker sent it/.test(l))).toEqual([
        expect.stringMatching(/transaction pooler .*\(listenConnectionString; --listen-database-url or LISTEN_DATABASE_URL for `outlive worker`\)\. Polling every 300 ms\./),
      ]);
      expect(log.lines.find((l) => /started/.test(l))).toMatch(/started \(LISTEN receives nothing here, polling every 300 ms/);
      if (pooler) expect(pooler.dropped).toBeGreaterThan(0);
      await enqueueCommittedOwn(own, 'by-polling');
      await until(() => effectOwn(own, 'by-polling'));
      await worker.stop();

      // With a direct connection for its listener, the same worker is woken by the enqueue.
      const direct = memoryLog();
      const woken = createWorker({
        connectionString: pooledUrl,
        listenConnectionString: own.directUrl,
        tasks: [ownRecord],
        pollIntervalMs: 600_000,
        retention: false,
        logger: direct,
      });
      workers.push(woken);
      await woken.start();
      expect(direct.lines.some((l) => /did not receive/.test(l))).toBe(false);
      expect(direct.lines.find((l) => /started/.test(l))).toMatch(/listening on "outlive"/);
      await enqueueCommittedOwn(own, 'by-notification');
      await until(() => effectOwn(own, 'by-notification'));
      await woken.stop();
    } finally {
      await pooler?.close();
    }
  });

  it('reconnects when the server kills its LISTEN connection, and runs what was enqueued meanwhile', async () => {
    const own = await freshDb();
    const log = memoryLog();
    const applicationName = 'outlive-listener-reconnect-test';
    const worker = createWorker({
      connectionString: own.url,
      listenConnectionString: own.directUrl,
      tasks: [ownRecord],
      pollIntervalMs: 600_000,
      applicationName,
      reconnect: { baseMs: 400 },
      retention: false,
      logger: log,
    });
    workers.push(worker);
    await worker.start();
    const listenerPid = async () =>
      (await own.rows<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, [applicationName]))[0]?.pid;
    const before = await listenerPid();
    expect(before).toBeDefined();
    // The pass start() wakes must be over, or it may claim the task below
    // itself, and the test would not show that the reconnect runs it.
    await until(async () => worker.stats.passes >= 1);

    await own.pool.query('SELECT pg_terminate_backend($1)', [before]);
    await log.waitFor(/LISTEN connection lost/);
    // Enqueued while nobody listens: only the reconnect's pass can run it in time.
    await enqueueCommittedOwn(own, 'during-outage');
    await until(() => effectOwn(own, 'during-outage'));
    expect(worker.stats).toMatchObject({ disconnects: 1, reconnects: 1 });
    expect(log.lines.some((l) => /LISTEN connection re-established/.test(l))).toBe(true);
    const after = await listenerPid();
    expect(after).toBeDefined();
    expect(after).not.toBe(before);

    // And notifications work again on the new connection.
    await enqueueCommittedOwn(own, 'after-reconnect');
    await until(() => effectOwn(own, 'after-reconnect'));
    await worker.stop();
    expect(worker.state).toBe('stopped');
  });

  it('coalesces a burst of wake-ups: 1,000 enqueues in 1,000 transactions make a few passes, and run beside a long task', async () => {
    const own = await freshDb();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let ran = 0;
    let holding = false;
    const hold = defineTask({
      name: 'hold',
      input: z.object({}),
      // Longer than the test: only the release below ends it.
      timeoutMs: 120_000,
      run: () => {
        holding = true;
        return gate;
      },
    });
    const count = defineTask({
      name: 'count',
      input: z.object({ i: z.number() }),
      run: () => {
        ran++;
      },
    });
    const passes: TickReport[] = [];
    const worker = createWorker({
      connectionString: own.url,
      listenConnectionString: own.directUrl,
      tasks: [hold, count],
      concurrency: 20,
      pollIntervalMs: 600_000,
      retention: false,
      logger: memoryLog(),
      onPass: (r) => passes.push(r),
    });
    workers.push(worker);
    await worker.start();
    await until(async () => passes.length >= 1); // the pass at start, with nothing to do
    const holdId = await enqueueCommitted(hold, {}, own);
    // The pass holding the gate task is busy: every enqueue below notifies it.
    await until(async () => holding);
    // Ten at a time, each in its own transaction, so each commit notifies.
    for (let i = 0; i < 1000; i += 10) {
      await Promise.all(Array.from({ length: 10 }, (_, j) => enqueueCommitted(count, { i: i + j }, own)));
    }
    // The pass holding the gate task has 19 slots free: the notifications
    // wake it, and it runs the burst while the gate task still holds its slot.
    await until(async () => ran === 1000);
    expect(await own.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [holdId])).toEqual([{ state: 'running' }]);
    expect(passes.length).toBe(1);
    release();
    await until(async () => passes.length >= 3);
    // The start pass, the pass that ran the gate and the burst beside it,
    // and one more asked for by the notifications that came during it.
    expect(passes.length).toBe(3);
    expect(passes.map((p) => p.claimed)).toEqual([0, 1001, 0]);
    await worker.stop();
  });

  it('fires its schedules from its own clock and runs them', async () => {
    const own = await freshDb();
    let ranFor: string | undefined;
    const tickTask = defineTask({ name: 'every-second', input: z.object({ slot: z.string() }), run: ({ slot }) => void (ranFor ??= slot) });
    const everySecond = defineSchedule({ name: 'every-second', cron: '* * * * * *', task: tickTask, input: (slot) => ({ slot: slot.toISOString() }) });
    const worker = createWorker({ connectionString: own.url, listenConnectionString: own.directUrl, tasks: [], schedules: [everySecond], retention: false, logger: memoryLog() });
    workers.push(worker);
    await worker.start();
    // The schedule's task was added to the worker's tasks; a slot fires within a second or two.
    await until(async () => ranFor);
    await worker.stop();
    const [row] = await own.rows<{ last_slot: Date }>(`SELECT last_slot FROM outlive.schedules WHERE name = 'every-second'`);
    expect(row!.last_slot).toBeInstanceOf(Date);
  });

  it('logs a schedule name read from a row with its control characters escaped, never as a line of its own or a terminal escape', async () => {
    const own = await freshDb();
    // Written by another role: a name no defineSchedule would take.
    const planted = 'gone\n\u001b[2Joutlive worker: stopped';
    await own.pool.query(`INSERT INTO outlive.schedules (name, cron, timezone, task, next_slot) VALUES ($1, '0 * * * *', 'UTC', 'x', now() + interval '1 hour')`, [planted]);
    const hourly = defineSchedule({ name: 'hourly', cron: '0 * * * *', task: defineTask({ name: 'hourly-task', input: z.object({}), run: () => null }), input: {} });
    const log = memoryLog();
    const worker = createWorker({ connectionString: own.url, listenConnectionString: own.directUrl, tasks: [], schedules: [hourly], retention: false, logger: log });
    workers.push(worker);
    await worker.start();
    await log.waitFor(/removed/);
    await worker.stop();
    expect(log.lines).toContain('outlive worker: schedule "gone\\n\\u001b[2Joutlive worker: stopped" removed: it is no longer in the code');
    expect(log.lines.join('')).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/);
  });

  it('aborts a task that outlives the grace period through its signal and hands its row back; a second stop shortens the grace', async () => {
    const own = await freshDb();
    let started = false;
    const stuck = defineTask({
      name: 'stuck',
      input: z.object({}),
      retry: { maxAttempts: 3, backoff: { baseMs: 60_000 } },
      timeoutMs: 60_000,
      run: (_input, ctx) =>
        new Promise((_resolve, reject) => {
          started = true;
          ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason));
        }),
    });
    const worker = createWorker({ connectionString: own.url, listenConnectionString: own.directUrl, tasks: [stuck], pollIntervalMs: 600_000, retention: false, logger: memoryLog() });
    workers.push(worker);
    await worker.start();
    const id = await enqueueCommitted(stuck, {}, own);
    await until(async () => started);
    const first = worker.stop({ graceMs: 600_000 });
    // As a second SIGINT does: the grace ends now.
    await worker.stop({ graceMs: 0 });
    await first;
    const [row] = await own.rows<{ state: string; lease_owner: string | null; last_error: string | null; attempts: number; due: boolean }>(
      `SELECT state::text, lease_owner, last_error, attempts, run_at <= now() AS due FROM outlive.tasks WHERE id = $1`,
      [id],
    );
    // Handed back: pending and due at once, the attempt not counted, no error recorded.
    expect(row).toEqual({ state: 'pending', lease_owner: null, last_error: null, attempts: 0, due: true });
  });

  it('checks its options before connecting', () => {
    expect(() => createWorker({ tasks: [recordLabel] } as never)).toThrow(/needs a database: pass `connectionString`/);
    expect(() => createWorker({ connectionString: db.url, tasks: [recordLabel], concurrency: 0 })).toThrow(/concurrency must be a whole number >= 1/);
    expect(() => createWorker({ connectionString: db.url, tasks: [recordLabel], budgetMs: 1_000 })).toThrow(/must exceed the longest task timeout \(15000 ms\) by at least 1,000 ms/);
  });
});
