/**
 * A system process: loads one driver (argv[2]) and runs what the
 * orchestrator asks over the IPC channel. Runs on the machine's Node through
 * tsx for outlive and outlive-drop (the same driver, its task defined with
 * `keepSucceeded: false`), and on Node 22 (which runs TypeScript by
 * stripping types) for graphile-worker and pg-boss.
 *
 * Every statement any library sends goes through node-postgres'
 * `Client#query`, so wrapping it here counts round trips for every system
 * the same way, without touching their code.
 */
import { createRequire } from 'node:module';
import pg from 'pg';
import { epochMs, type Counters, type Driver, type Payload, type Progress, type Reply, type Request, type SystemName, type WorkerReport } from './systems/protocol.ts';

const system = process.argv[2] as SystemName;

let queries = 0;
const statements = new Map<string, { n: number; ms: number }>();

function statementKey(arg: unknown): string {
  const text = typeof arg === 'string' ? arg : ((arg as { text?: string; name?: string })?.text ?? (arg as { name?: string })?.name ?? '?');
  return text.replace(/\s+/g, ' ').trim().slice(0, 80);
}
// bench/ has its own node-postgres (the peers' dependency) and the repository
// root has the one the engine imports; count both.
const pgModules = new Set<typeof pg>([pg]);
try {
  pgModules.add(createRequire(new URL('../package.json', import.meta.url))('pg'));
} catch {
  // The root's dependencies are not installed: only outlive needs them.
}
for (const module of pgModules) {
  const originalQuery = module.Client.prototype.query;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  (module.Client.prototype as any).query = function countedQuery(this: pg.Client, ...args: unknown[]) {
    queries++;
    const key = statementKey(args[0]);
    let stat = statements.get(key);
    if (!stat) statements.set(key, (stat = { n: 0, ms: 0 }));
    stat.n++;
    const started = performance.now();
    const done = () => {
      stat.ms += performance.now() - started;
    };
    // pg.Pool#query calls the client with a callback; everyone else awaits a promise.
    const last = args[args.length - 1];
    if (typeof last === 'function') {
      args[args.length - 1] = function timedCallback(this: unknown, ...cbArgs: unknown[]) {
        done();
        return (last as (...a: unknown[]) => unknown).apply(this, cbArgs);
      };
    }
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const result = (originalQuery as any).apply(this, args);
    if (typeof last !== 'function' && result && typeof result.then === 'function') result.then(done, done);
    return result;
  };
}

let cpuBase = process.cpuUsage();
function counters(): Counters {
  const cpu = process.cpuUsage(cpuBase);
  const top = [...statements.entries()]
    .map(([text, s]) => ({ text, n: s.n, ms: s.ms }))
    .sort((a, b) => b.n - a.n)
    .slice(0, 12);
  return { queries, cpuMs: (cpu.user + cpu.system) / 1000, statements: top };
}

async function loadDriver(): Promise<Driver> {
  switch (system) {
    case 'outlive':
      return (await import('./systems/outlive.ts')).createDriver();
    case 'outlive-drop':
      return (await import('./systems/outlive.ts')).createDriver({ keepSucceeded: false });
    case 'graphile-worker':
      return (await import('./systems/graphile.ts')).createDriver();
    case 'pg-boss':
      return (await import('./systems/pgboss.ts')).createDriver();
    default:
      throw new Error(`bench: unknown system "${String(system)}"`);
  }
}

const driver = await loadDriver();

// What the running worker has done.
let runCounts = new Uint8Array(0);
let ran = 0;
let firstRunAt: number | null = null;
let lastRunAt: number | null = null;
let latencies: number[] = [];
let progressTimer: ReturnType<typeof setInterval> | null = null;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** Counts a job as its handler starts; a job with `sleepMs` then waits that long before it is done. */
function runJob(payload: Payload): void | Promise<void> {
  const now = epochMs();
  firstRunAt ??= now;
  lastRunAt = now;
  ran++;
  if (payload.i >= 0 && payload.i < runCounts.length && runCounts[payload.i]! < 255) runCounts[payload.i]!++;
  if (typeof payload.t === 'number') latencies.push(now - payload.t);
  if (typeof payload.sleepMs === 'number' && payload.sleepMs > 0) return sleep(payload.sleepMs);
}

const ops: Record<string, (args: Record<string, unknown>) => Promise<unknown>> = {
  async hello({ concurrency }) {
    return { system, version: driver.version(), settings: driver.settings(Number(concurrency ?? 10)), node: process.version, pid: process.pid };
  },
  async install({ url }) {
    await driver.install(url as string);
  },
  async open({ url }) {
    await driver.open(url as string);
  },
  async resetCounters() {
    queries = 0;
    statements.clear();
    cpuBase = process.cpuUsage();
  },
  async counters() {
    return counters();
  },
  async enqueueSingle({ from, count, transaction }) {
    const started = performance.now();
    for (let k = 0; k < (count as number); k++) {
      const payload = { i: (from as number) + k };
      if (transaction) await driver.enqueueOneInTransaction(payload);
      else await driver.enqueueOne(payload);
    }
    return { ms: performance.now() - started };
  },
  async enqueueBulk({ from, count, chunk, sleepMs }) {
    const payloads: Payload[] = [];
    for (let k = 0; k < (count as number); k++) {
      payloads.push(typeof sleepMs === 'number' ? { i: (from as number) + k, sleepMs } : { i: (from as number) + k });
    }
    const started = performance.now();
    for (let k = 0; k < payloads.length; k += chunk as number) {
      await driver.enqueueMany(payloads.slice(k, k + (chunk as number)));
    }
    return { ms: performance.now() - started };
  },
  /** Enqueues `count` jobs one by one, one every `spacingMs`, each stamped with the time of its call. */
  async enqueueSpaced({ from, count, spacingMs, sleepMs }) {
    const started = performance.now();
    for (let k = 0; k < (count as number); k++) {
      await sleep(started + k * (spacingMs as number) - performance.now());
      const payload: Payload = { i: (from as number) + k, t: epochMs() };
      if (typeof sleepMs === 'number') payload.sleepMs = sleepMs;
      await driver.enqueueOne(payload);
    }
    return { ms: performance.now() - started };
  },
  async startWorker({ concurrency, size }) {
    runCounts = new Uint8Array(size as number);
    ran = 0;
    firstRunAt = null;
    lastRunAt = null;
    latencies = [];
    let reported = -1;
    progressTimer = setInterval(() => {
      if (ran !== reported) {
        reported = ran;
        process.send!({ event: 'progress', ran } satisfies Progress);
      }
    }, 20);
    await driver.startWorker({ concurrency: concurrency as number }, runJob);
  },
  async stopWorker(): Promise<WorkerReport> {
    await driver.stopWorker();
    if (progressTimer) clearInterval(progressTimer);
    progressTimer = null;
    return { ran, counts: Buffer.from(runCounts).toString('base64'), firstRunAt, lastRunAt, latencies };
  },
  async close() {
    await driver.close();
  },
  async claimTime(args) {
    if (system !== 'outlive') throw new Error('claimTime is an outlive phase');
    const { claimTime } = await import('./systems/outlive.ts');
    return claimTime(args.url as string, args as never);
  },
  async startDagRun({ url, leaves, spawned }) {
    if (system !== 'outlive') throw new Error('startDagRun is an outlive phase');
    const { startDagRun } = await import('./systems/outlive.ts');
    return startDagRun(url as string, leaves as number, spawned as boolean);
  },
  async serverlessDrain(args) {
    if (system !== 'outlive') throw new Error('serverlessDrain is an outlive phase');
    const { serverlessDrain } = await import('./systems/serverless.ts');
    return serverlessDrain(args.url as string, args as never);
  },
  /** The flow-control phases' own ops (lib/flow.ts): systems/flow-outlive.ts or systems/flow-pgboss.ts. */
  async flow(args) {
    const mod =
      system === 'outlive'
        ? await import('./systems/flow-outlive.ts')
        : system === 'pg-boss'
          ? await import('./systems/flow-pgboss.ts')
          : null;
    const op = mod?.flowOps[args.fn as string];
    if (!op) throw new Error(`bench child: ${system} has no flow op "${String(args.fn)}"`);
    return op(args);
  },
  /** The waits phases' own ops (lib/waits.ts): systems/waits-outlive.ts. */
  async waits(args) {
    if (system !== 'outlive') throw new Error('waits is an outlive phase');
    const op = (await import('./systems/waits-outlive.ts')).waitOps[args.fn as string];
    if (!op) throw new Error(`bench child: no waits op "${String(args.fn)}"`);
    return op(args);
  },
  async exit() {
    setImmediate(() => process.exit(0));
  },
};

process.on('message', (message: Request) => {
  const op = ops[message.op];
  const reply = (r: Reply) => process.send!(r);
  if (!op) {
    reply({ id: message.id, ok: false, error: `bench child: unknown op "${message.op}"` });
    return;
  }
  op(message.args ?? {}).then(
    (result) => reply({ id: message.id, ok: true, result: result ?? null }),
    (err: unknown) => reply({ id: message.id, ok: false, error: err instanceof Error ? (err.stack ?? err.message) : String(err) }),
  );
});

process.on('disconnect', () => process.exit(0));
process.send!({ event: 'ready' });
