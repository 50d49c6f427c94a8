/**
 * outlive's side of the waits phases (lib/waits.ts, issue 27): runs whose
 * steps wait (waitFor, sleepStep), the passes that park them, the LISTEN
 * worker that resumes them, the signals, and the drain-nudge variant of
 * signal-resume (the Cloudflare Worker in Miniflare). Runs in a system
 * process (child.ts, op `waits`), importing the engine from the working tree
 * as systems/outlive.ts does.
 */
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import type PgModule from 'pg';
import { z } from 'zod';
import * as core from '../../src/index.ts';
import * as node from '../../src/node/index.ts';
import { epochMs } from './protocol.ts';

const outlive = { ...core, ...node };
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
// The repository's node-postgres: createWorker checks `pool instanceof pg.Pool` against it.
const pg = createRequire(`${ROOT}/package.json`)('pg') as typeof PgModule;
type Pool = PgModule.Pool;

const quiet: node.WorkerLogger = {
  info: () => undefined,
  warn: (m) => console.warn(m),
  error: (m) => console.error(m),
};

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** The step after a wait (signal-resume), by the run's index; the Worker of the drain variant defines the same name (waits-worker-tasks.ts). */
export const NEXT_TASK = 'wait-next';
/** Plain tasks enqueued during the deadline storm, stamped with the time of their enqueue call. */
export const PLAIN_TASK = 'wait-plain';

/** What the worker of this process saw: `next` starts and plain-task starts, as [i, epoch ms] and [i, enqueued at, started at]. */
interface Seen {
  next: [number, number][];
  plain: [number, number, number][];
}
let seen: Seen = { next: [], plain: [] };

const nextTask = outlive.defineTask({
  name: NEXT_TASK,
  input: z.object({ i: z.number().int() }),
  run: ({ i }) => {
    seen.next.push([i, epochMs()]);
  },
});
const plainTask = outlive.defineTask({
  name: PLAIN_TASK,
  input: z.object({ i: z.number().int(), t: z.number() }),
  run: ({ i, t }) => {
    seen.plain.push([i, t, epochMs()]);
  },
});
const TASKS = [nextTask, plainTask];

/** The kinds of run the phases write: each one run per index. */
export type RunKind = 'signal' | 'wait' | 'sleep' | 'deadline';

/** The steps of run `i` of `kind`; `prefix` keys the signals. */
function stepsOf(kind: RunKind, i: number, prefix: string, timeoutMs: number): Record<string, core.Step> {
  switch (kind) {
    case 'signal':
      return { w: outlive.waitFor(`${prefix}${i}`, { timeoutMs }), next: outlive.step(nextTask, { i }, { after: ['w'] }) };
    case 'wait':
      return { w: outlive.waitFor(`${prefix}${i}`, { timeoutMs }) };
    case 'sleep':
      return { s: outlive.sleepStep({ ms: timeoutMs }) };
    case 'deadline':
      // Odd runs succeed with null at the deadline, even ones fail.
      return { w: outlive.waitFor(`${prefix}${i}`, { timeoutMs, onTimeout: i % 2 === 1 ? { value: null } : 'fail' }) };
  }
}

let url = '';
let pool: Pool | null = null;
let worker: node.Worker | null = null;
let plainLoop: { stop: () => Promise<[number, number][]> } | null = null;

function must<T>(value: T | null, what: string): T {
  if (value === null) throw new Error(`waits-outlive: ${what} first`);
  return value;
}

/**
 * Writes `count` runs with startRun, one statement each, `chunk` runs per
 * transaction, on `connections` connections at once.
 */
async function writeRuns(kind: RunKind, from: number, count: number, prefix: string, timeoutMs: number, chunk: number, connections: number): Promise<number> {
  const own = new pg.Pool({ connectionString: url, max: connections, application_name: 'benchwait-writer' });
  own.on('error', (err) => console.warn(`waits writer pool: ${err.message}`));
  const started = performance.now();
  let next = from;
  const end = from + count;
  try {
    await Promise.all(
      Array.from({ length: connections }, async () => {
        const client = await own.connect();
        try {
          while (next < end) {
            const lo = next;
            const hi = Math.min(end, lo + chunk);
            next = hi;
            await client.query('BEGIN');
            for (let i = lo; i < hi; i++) await outlive.startRun(client, `wait-${kind}`, stepsOf(kind, i, prefix, timeoutMs));
            await client.query('COMMIT');
          }
        } finally {
          client.release();
        }
      }),
    );
  } finally {
    await own.end();
  }
  return performance.now() - started;
}

/** Passes of tick() back to back until one begins no wait: every due wait is parked (or ended). */
async function park(concurrency: number): Promise<{ ms: number; parked: number; ended: number; passes: number }> {
  const own = new pg.Pool({ connectionString: url, max: 4, application_name: 'benchwait-park' });
  own.on('error', (err) => console.warn(`waits park pool: ${err.message}`));
  const started = performance.now();
  let parked = 0;
  let ended = 0;
  let passes = 0;
  try {
    for (;;) {
      const r = await outlive.tick(own, { tasks: TASKS, concurrency, prefetch: concurrency, owner: 'benchwait-park', recover: false, budgetMs: 60_000 });
      passes++;
      parked += r.parked;
      ended += r.succeeded + r.failed + r.retried;
      if (r.parked === 0 && r.succeeded + r.failed + r.retried === 0) break;
    }
  } finally {
    await own.end();
  }
  return { ms: performance.now() - started, parked, ended, passes };
}

/** Enqueues plain tasks one at a time, `spacingMs` apart, until stopped; returns [i, stamped at] of each. */
function startPlainLoop(spacingMs: number): { stop: () => Promise<[number, number][]> } {
  const sent: [number, number][] = [];
  let stopped = false;
  const done = (async () => {
    const started = performance.now();
    for (let k = 0; !stopped; k++) {
      await sleep(started + k * spacingMs - performance.now());
      if (stopped) break;
      const t = epochMs();
      await outlive.enqueue(must(pool, 'open'), plainTask, { i: k, t });
      sent.push([k, t]);
    }
  })();
  return {
    async stop() {
      stopped = true;
      await done;
      return sent;
    },
  };
}

/** What one signal did: [i, epoch ms before the call, epoch ms after it returned (committed), waits it ended]. */
type SentSignal = [number, number, number, number];

/** Signals `${prefix}${k}` for k in [0, count), `spacingMs` apart, each committing on its own on one connection; `after` runs after each commit (the nudge). */
async function signalSpaced(prefix: string, count: number, spacingMs: number, after?: () => void): Promise<SentSignal[]> {
  const client = await must(pool, 'open').connect();
  const out: SentSignal[] = [];
  try {
    const started = performance.now();
    for (let k = 0; k < count; k++) {
      await sleep(started + k * spacingMs - performance.now());
      // One statement committing on its own, as the latency phase's enqueue does: its own transaction.
      const t0 = epochMs();
      const r = await outlive.signal(client, `${prefix}${k}`, { i: k }, { id: 'bench' });
      const tc = epochMs();
      after?.();
      out.push([k, t0, tc, r.delivered]);
    }
  } finally {
    client.release();
  }
  return out;
}

/** What the drain-nudge variant of signal-resume returns. */
export interface DrainResumeResult {
  signals: SentSignal[];
  /** The same for plain enqueues of the step's task (indexes from the count of signals), each followed by a nudge. */
  enqueues: SentSignal[];
  /** [i, epoch ms] when this process read the handler's line from workerd's output. */
  starts: [number, number][];
  /** Nudges answered 2xx, and the statuses of the others. */
  nudged: number;
  failedNudges: (number | null)[];
  /** [i, Date.now() in workerd when the handler ran] (workerd's clock moves only at I/O: a lower bound of the start). */
  workerClock: [number, number][];
  /** Bundling and starting workerd, writing and parking the runs, ms. */
  startMs: number;
  parkMs: number;
  output: string;
}

/**
 * signal-resume through the drain: the Cloudflare Worker (functions/,
 * Neon entry, this phase's tasks module) in Miniflare; runs written and
 * their waits parked from here; then each signal commits here and a signed
 * nudge (`nudge()`, respond-async) starts a pass in the Worker, which ends
 * the wait and starts the step after it. The step's handler prints a line,
 * timed when it reaches this process.
 */
async function drainResume(args: Record<string, unknown>): Promise<DrainResumeResult> {
  const count = Number(args.count);
  const started = performance.now();
  const { Miniflare } = await import('miniflare');
  const { bundleWorker } = await import('../../scripts/local/bundle.ts');
  const { startWsProxy } = await import('../../test/support/ws-proxy.ts');
  const target = new URL(url);
  const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
  const secret = Array.from(globalThis.crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
  const starts: [number, number][] = [];
  const workerClock: [number, number][] = [];
  let output = '';
  let partial = '';
  const read = (chunk: Buffer) => {
    const at = epochMs();
    const text = partial + String(chunk);
    const lines = text.split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const m = /bench-wait-next (\d+) (\d+)/.exec(line);
      if (m) {
        starts.push([Number(m[1]), at]);
        workerClock.push([Number(m[1]), Number(m[2])]);
      }
      else output += `${line}\n`;
    }
  };
  const mf = new Miniflare({
    modules: true,
    script: await bundleWorker({ entry: 'neon', tasksModule: fileURLToPath(new URL('./waits-worker-tasks.ts', import.meta.url)) }),
    compatibilityDate: '2025-09-01',
    bindings: {
      DATABASE_URL: url,
      NEON_WS_PROXY: proxy.address,
      OUTLIVE_DRAIN_SECRET: secret,
      OUTLIVE_CONCURRENCY: String(args.concurrency),
      OUTLIVE_BUDGET_MS: '20000',
    },
    handleRuntimeStdio(stdout: Readable, stderr: Readable) {
      stdout.on('data', read);
      stderr.on('data', (chunk: Buffer) => (output += String(chunk)));
    },
  });
  try {
    const drainUrl = new URL('/drain', await mf.ready).toString();
    const startMs = performance.now() - started;
    const p0 = performance.now();
    await writeRuns('signal', 0, count, String(args.prefix), Number(args.timeoutMs), count, 1);
    const parkedBy = await park(Number(args.concurrency));
    if (parkedBy.parked !== count) throw new Error(`drain variant: ${parkedBy.parked} of ${count} waits parked`);
    const parkMs = performance.now() - p0;
    await sleep(Number(args.idleMs));
    const nudges: Promise<core.NudgeResult>[] = [];
    const signals = await signalSpaced(String(args.prefix), count, Number(args.spacingMs), () => {
      nudges.push(outlive.nudge(drainUrl, secret));
    });
    const deadline = performance.now() + 60_000;
    while (starts.length < count && performance.now() < deadline) await sleep(10);
    // The drain's own enqueue-to-start, for comparison: `next` tasks enqueued alone (indexes from `count`), each committed, then nudged.
    await sleep(Number(args.idleMs));
    const enqueues: SentSignal[] = [];
    const started2 = performance.now();
    for (let k = 0; k < count; k++) {
      await sleep(started2 + k * Number(args.spacingMs) - performance.now());
      const t0 = epochMs();
      await outlive.enqueue(must(pool, 'open'), nextTask, { i: count + k });
      const tc = epochMs();
      nudges.push(outlive.nudge(drainUrl, secret));
      enqueues.push([count + k, t0, tc, 1]);
    }
    const results = await Promise.all(nudges);
    while (starts.length < 2 * count && performance.now() < deadline + 60_000) await sleep(10);
    // A moment more, for a handler that would run twice.
    await sleep(500);
    return {
      signals,
      enqueues,
      starts,
      nudged: results.filter((r) => r.delivered).length,
      failedNudges: results.filter((r) => !r.delivered).map((r) => r.status),
      startMs,
      parkMs,
      workerClock,
      output: output.slice(-2_000),
    };
  } finally {
    await mf.dispose();
    await proxy.close();
  }
}

/** The waits ops a system process answers (child.ts, op `waits`). */
export const waitOps: Record<string, (args: Record<string, unknown>) => Promise<unknown>> = {
  async version() {
    return JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')).version + ' (working tree)';
  },
  async install(args) {
    await outlive.migrate(args.url as string);
  },
  async open(args) {
    url = args.url as string;
    pool = new pg.Pool({ connectionString: url, max: 2, application_name: 'benchwait-outlive' });
    pool.on('error', (err) => console.warn(`waits pool: ${err.message}`));
    await pool.query('SELECT 1');
  },
  /** Writes runs of `kind` (see stepsOf). */
  async writeRuns(args) {
    const ms = await writeRuns(
      args.kind as RunKind,
      Number(args.from ?? 0),
      Number(args.count),
      String(args.prefix ?? ''),
      Number(args.timeoutMs),
      Number(args.chunk ?? 1_000),
      Number(args.connections ?? 1),
    );
    return { ms };
  },
  async park(args) {
    return park(Number(args.concurrency ?? 500));
  },
  /** createWorker as an app runs it (defaults: LISTEN, a pass every 2 s when idle, retention on), with this phase's tasks. */
  async startWorker(args) {
    seen = { next: [], plain: [] };
    worker = outlive.createWorker({ connectionString: url, tasks: TASKS, concurrency: Number(args.concurrency), logger: quiet });
    await worker.start();
  },
  async progress() {
    return { next: seen.next.length, plain: seen.plain.length, passes: worker?.stats.passes ?? 0 };
  },
  async stopWorker() {
    const stats = worker ? { ...worker.stats } : null;
    await worker?.stop();
    worker = null;
    return { seen, stats };
  },
  async signalSpaced(args) {
    return signalSpaced(String(args.prefix), Number(args.count), Number(args.spacingMs));
  },
  async startPlain(args) {
    plainLoop = startPlainLoop(Number(args.spacingMs));
  },
  async stopPlain() {
    const sent = (await plainLoop?.stop()) ?? [];
    plainLoop = null;
    return sent;
  },
  async drainResume(args) {
    return drainResume(args);
  },
  async close() {
    await plainLoop?.stop();
    plainLoop = null;
    await worker?.stop();
    worker = null;
    await pool?.end();
    pool = null;
  },
};
