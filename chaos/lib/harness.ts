/**
 * The chaos run: its own PostgreSQL, worker and tick processes over a mixed
 * workload, faults injected while it runs, then a final recovery and the
 * checks. `runChaos` is what `npm run chaos` and test/chaos.test.ts call.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { enqueueDue, enqueueMany, recover, startRun, step, tick } from '../../src/index.js';
import { migrate } from '../../src/node/index.js';
import { checkAll, type CheckReport, type Expected } from './check.js';
import { startOwnPostgres, type OwnPostgres } from './postgres.js';
import { prng, type Prng } from './prng.js';
import { startProxy, type TcpProxy } from './proxy.js';
import { chaosTasks, createEffects, LIMITED_CONCURRENCY, type Behaviour, type Mode } from './tasks.js';
import { drawWaitPlan, playWaitPlan, type SignallerDeps, type WaitLog } from './waits.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** The faults the run can inject. */
export const FAULTS = ['kill', 'terminate', 'drop', 'stall', 'restart', 'backdate', 'cronStorm'] as const;
export type Fault = (typeof FAULTS)[number];

/** The shape of one run. */
export interface ChaosConfig {
  seed: number;
  /** How long work is produced and faults injected. */
  durationMs: number;
  plainTasks: number;
  runs: number;
  /** Runs that wait for a signal or sleep between two steps (chaos/lib/waits.ts). */
  waitRuns?: number;
  /** Children per fan-out: from, to. */
  fanout: [number, number];
  workers: number;
  tickers: number;
  /** Mean gap between faults. */
  faultEveryMs: number;
  /** Weights of the faults (0 or absent: never). */
  faults: Partial<Record<Fault, number>>;
  /** Longest wait for the processes to drain the work after the faults stop. */
  drainMs: number;
  dataDir: string;
  log?: (line: string) => void;
}

/** What a run did and found. */
export interface ChaosResult {
  seed: number;
  check: CheckReport;
  faults: Record<string, number>;
  /** Summed from the processes' pass reports. */
  passes: { claimed: number; succeeded: number; lostLeases: number; recovered: number; errors: number };
  /** Child processes that died without being killed by the run: each is a finding. */
  unexpectedExits: string[];
  enqueueFailures: number;
  finalRecovered: number;
  finalDrained: number;
  durationMs: number;
}

interface Child {
  name: string;
  kind: 'worker' | 'tick';
  url: string;
  proc: ChildProcess;
  killed: boolean;
}

function behaviour(rng: Prng, n: number): Behaviour {
  const mode: Mode = rng.weighted({ ok: 60, flaky: 15, fail: 4, slow: 15, hang: 6 });
  if (mode === 'flaky') return { n, mode, failUntil: rng.int(2, 3) };
  if (mode === 'slow') return { n, mode, sleepMs: rng.int(100, 900) };
  if (mode === 'hang') return { n, mode, sleepMs: rng.int(200, 1_500) };
  return { n, mode };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs the chaos once and returns what it found. Throws only when the harness itself cannot run. */
export async function runChaos(config: ChaosConfig): Promise<ChaosResult> {
  const started = Date.now();
  const log = config.log ?? (() => {});
  // Separate streams, so the work drawn does not depend on how the faults interleave with it.
  const rng = prng(config.seed);
  const faultRng = prng((config.seed ^ 0x9e3779b9) >>> 0);
  // Its own stream too, so adding waits leaves the rest of a seed's workload as it was.
  const waitRng = prng((config.seed ^ 0x5bd1e995) >>> 0);
  const server = await startOwnPostgres(config.dataDir);
  const children: Child[] = [];
  let proxy: TcpProxy | undefined;
  try {
    return await runOn(server);
  } catch (err) {
    // Leave nothing behind: no process, no server.
    for (const c of children) {
      c.killed = true;
      c.proc.kill('SIGKILL');
    }
    await proxy?.close().catch(() => {});
    await server.stop().catch(() => {});
    throw err;
  }

  async function runOn(server: OwnPostgres): Promise<ChaosResult> {
    const admin = new pg.Client({ connectionString: server.url('postgres') });
    await admin.connect();
    await admin.query('CREATE DATABASE chaos');
    await admin.end();
    const url = server.url('chaos');
    await migrate(url);
    const pool = new pg.Pool({ connectionString: url, max: 8, application_name: 'chaos-orchestrator' });
    pool.on('error', () => {});
    await createEffects(pool);
    const tasks = chaosTasks(pool);

    const tcp = await startProxy(server.port);
    proxy = tcp;
    const proxiedUrl = `postgres://postgres:postgres@127.0.0.1:${tcp.port}/chaos`;
    // Signals go through the proxy, so its drops and stalls cut them as they cut the processes.
    const signalPool = new pg.Pool({ connectionString: proxiedUrl, max: 6, application_name: 'chaos-signaller' });
    signalPool.on('error', () => {});
    // The signaller watches for parked waits on a pool of its own, so its polls never queue the producer.
    const watchPool = new pg.Pool({ connectionString: url, max: 3, application_name: 'chaos-watch' });
    watchPool.on('error', () => {});
    const passes = { claimed: 0, succeeded: 0, lostLeases: 0, recovered: 0, errors: 0 };
    const unexpectedExits: string[] = [];
    const faults: Record<string, number> = {};

    const launch = (name: string, kind: 'worker' | 'tick', childUrl: string): Child => {
      const proc = spawn(process.execPath, ['--conditions=outlive-source', '--import', 'tsx', path.join(root, 'chaos/child.ts'), kind, childUrl, name], {
        cwd: root,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const child: Child = { name, kind, url: childUrl, proc, killed: false };
      let buffer = '';
      proc.stdout!.on('data', (chunk: Buffer) => {
        buffer += String(chunk);
        let i: number;
        while ((i = buffer.indexOf('\n')) >= 0) {
          const line = buffer.slice(0, i);
          buffer = buffer.slice(i + 1);
          try {
            const r = JSON.parse(line) as typeof passes;
            passes.claimed += r.claimed;
            passes.succeeded += r.succeeded;
            passes.lostLeases += r.lostLeases;
            passes.recovered += r.recovered;
            passes.errors += r.errors;
          } catch {
            log(`[${name}] ${line}`);
          }
        }
      });
      let stderr = '';
      proc.stderr!.on('data', (chunk: Buffer) => (stderr = (stderr + String(chunk)).slice(-6_000)));
      proc.on('exit', (code, signal) => {
        if (!child.killed) {
          unexpectedExits.push(`${name} (${kind}) exited with ${code ?? signal}: ${stderr.trim()}`);
          log(`!! ${name} exited unexpectedly (${code ?? signal}); restarting it`);
          const i = children.indexOf(child);
          if (i >= 0 && !stopping) children[i] = launch(`${name}'`, kind, childUrl);
        }
      });
      return child;
    };

    let stopping = false;
    // Some of each kind go through the proxy, the others straight to the server.
    for (let i = 0; i < config.workers; i++) children.push(launch(`w${i}`, 'worker', i % 2 === 1 ? proxiedUrl : url));
    for (let i = 0; i < config.tickers; i++) children.push(launch(`t${i}`, 'tick', i % 2 === 0 ? proxiedUrl : url));

    const expected: Expected = { plain: new Set(), plainUncertain: new Set(), runs: new Set(), runsUncertain: new Set() };
    let enqueueFailures = 0;
    const productionEnds = started + config.durationMs;
    const waitPlays: Promise<WaitLog>[] = [];
    const signaller: SignallerDeps = {
      pool: watchPool,
      signalPool,
      tasks,
      onStarted(run, committed) {
        if (committed) expected.runs.add(run);
        else {
          enqueueFailures++;
          expected.runsUncertain.add(run);
        }
      },
    };

    // The producer: plain tasks in batches and runs, spread over the duration.
    const produce = async () => {
      const rounds = Math.max(1, Math.floor(config.durationMs / 200));
      const perRoundPlain = Math.ceil(config.plainTasks / rounds);
      const perRoundRuns = config.runs / rounds;
      const perRoundWaits = (config.waitRuns ?? 0) / rounds;
      let n = 0;
      let runCredit = 0;
      let runNo = 0;
      let waitCredit = 0;
      let waitNo = 0;
      for (let round = 0; round < rounds && n < config.plainTasks; round++) {
        const inputs: Behaviour[] = [];
        for (let i = 0; i < perRoundPlain && n < config.plainTasks; i++) inputs.push(behaviour(rng, n++));
        try {
          await enqueueMany(pool, tasks.plain, inputs);
          for (const b of inputs) expected.plain.add(b.n);
        } catch {
          enqueueFailures++;
          for (const b of inputs) expected.plainUncertain.add(b.n);
        }
        // Tasks with limits and fairness: a tenant with a backlog and three small ones.
        const limited = inputs.slice(0, Math.max(1, Math.floor(inputs.length / 8))).map((b, i) => ({ ...b, n: -10_000 - n - i, tenant: i % 2 === 0 ? 'big' : `t${i % 3}` }));
        try {
          await enqueueMany(pool, tasks.limited, limited);
        } catch {
          enqueueFailures++;
        }
        runCredit += perRoundRuns;
        while (runCredit >= 1) {
          runCredit--;
          const name = `run-${runNo++}`;
          const children = Array.from({ length: rng.int(config.fanout[0], config.fanout[1]) }, (_, i) => behaviour(rng, -1 - i));
          try {
            const tail = behaviour(rng, -1_000);
            await startRun(pool, name, { root: step(tasks.fan, { children, tail }), side: step(tasks.plain, behaviour(rng, -1_001)) });
            expected.runs.add(name);
          } catch {
            enqueueFailures++;
            expected.runsUncertain.add(name);
          }
        }
        // Each waiting run plays out on its own (its signals may come seconds later), not holding up the rounds.
        waitCredit += perRoundWaits;
        while (waitCredit >= 1) {
          waitCredit--;
          waitPlays.push(playWaitPlan(drawWaitPlan(waitRng, waitNo++), signaller));
        }
        await sleep(Math.max(0, started + ((round + 1) * config.durationMs) / rounds - Date.now()));
      }
    };

    const inject = async (fault: Fault) => {
      faults[fault] = (faults[fault] ?? 0) + 1;
      switch (fault) {
        case 'kill': {
          const i = faultRng.int(0, children.length - 1);
          const victim = children[i]!;
          victim.killed = true;
          victim.proc.kill('SIGKILL');
          log(`fault: SIGKILL ${victim.name}`);
          await sleep(faultRng.int(0, 500));
          children[i] = launch(`${victim.name}+`, victim.kind, victim.url);
          return;
        }
        case 'terminate': {
          // Now and then the signaller's connections, so a signal's answer is lost mid-flight.
          const who = faultRng.chance(0.25) ? 'signaller' : faultRng.pick(children).name.replace(/[+']+$/, '');
          const r = await pool.query(
            `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = 'chaos' AND application_name LIKE $1`,
            [`chaos-${who}%`],
          );
          log(`fault: pg_terminate_backend of ${who}'s ${r.rows[0].n} connections`);
          return;
        }
        case 'drop':
          log(`fault: proxy drops ${tcp.drop()} connections`);
          return;
        case 'stall': {
          const ms = faultRng.int(300, 2_500);
          tcp.stall(ms);
          log(`fault: proxy stalls ${ms} ms`);
          return;
        }
        case 'restart': {
          const down = faultRng.int(0, 1_500);
          log(`fault: PostgreSQL restart (${down} ms down)`);
          await server.restart(down);
          return;
        }
        case 'backdate': {
          // A lease that expires while its handler still runs (a GC pause, a
          // frozen VM): the next recovery hands the task back, the handler
          // finishes late, and its settle must match no row. A row is held
          // by its own lease or its pass's, so both are backdated.
          const k = faultRng.int(1, 5);
          const r = await pool.query(
            `WITH hit AS (
               UPDATE outlive.tasks SET lease_expires_at = now() - interval '1 millisecond'
               WHERE id IN (SELECT id FROM outlive.tasks WHERE state = 'running' ORDER BY md5(id::text || $1) LIMIT $2)
               RETURNING lease_owner
             ), passes AS (
               UPDATE outlive.leases SET expires_at = now() - interval '1 millisecond' WHERE owner IN (SELECT lease_owner FROM hit)
             )
             SELECT count(*)::int AS n FROM hit`,
            [String(faultRng.next()), k],
          );
          log(`fault: backdated ${r.rows[0].n} leases`);
          return;
        }
        case 'cronStorm': {
          const pools = Array.from({ length: 4 }, () => new pg.Pool({ connectionString: url, max: 1 }));
          for (const p of pools) p.on('error', () => {});
          try {
            const reports = await Promise.allSettled(pools.map((p) => enqueueDue(p, tasks.schedules)));
            const fired = reports.reduce((s, r) => s + (r.status === 'fulfilled' ? r.value.enqueued.length : 0), 0);
            log(`fault: the same slots fired from 4 places at once: ${fired} enqueued in all`);
          } finally {
            await Promise.all(pools.map((p) => p.end()));
          }
          return;
        }
      }
    };

    const chaos = async () => {
      const weights = Object.fromEntries(Object.entries(config.faults).filter(([, w]) => (w ?? 0) > 0)) as Record<Fault, number>;
      if (Object.keys(weights).length === 0) return;
      // Every enabled kind once first, in a seeded order, so even a short run injects each; then by weight.
      const kinds = Object.keys(weights) as Fault[];
      for (let i = kinds.length - 1; i > 0; i--) {
        const j = faultRng.int(0, i);
        [kinds[i], kinds[j]] = [kinds[j]!, kinds[i]!];
      }
      while (Date.now() < productionEnds) {
        await sleep(faultRng.int(Math.floor(config.faultEveryMs / 2), Math.floor((config.faultEveryMs * 3) / 2)));
        if (Date.now() >= productionEnds) break;
        const fault = kinds.shift() ?? faultRng.weighted(weights);
        try {
          await inject(fault);
        } catch (err) {
          log(`fault ${fault} could not be injected: ${(err as Error).message}`);
        }
        await sampleKeys(`after ${fault}`);
      }
    };

    // Each key's count of running tasks, against the running rows that hold
    // it, in one snapshot: the two move together in every statement, so any
    // difference, or a count over the key's concurrency, is a violation.
    const keyViolations: string[] = [];
    let keySamples = 0;
    const sampleKeys = async (when: string) => {
      const rows = await pool
        .query<{ key: string; running: number; actual: number }>(
          `SELECT l.key, l.running,
                  (SELECT count(*)::int FROM outlive.tasks t, jsonb_array_elements(t.limits) x
                   WHERE t.state = 'running' AND t.limits IS NOT NULL AND x->>'k' = l.key) AS actual
           FROM outlive.limits l`,
        )
        .then((r) => r.rows)
        .catch(() => null);
      if (!rows) return;
      keySamples++;
      for (const r of rows) {
        const cap = LIMITED_CONCURRENCY[r.key] ?? (r.key.startsWith('chaos.tenant:') ? 1 : Infinity);
        if (r.running !== r.actual || r.actual > cap) keyViolations.push(`${when}: key ${r.key} counts ${r.running} running, rows say ${r.actual}, limit ${cap}`);
      }
    };
    const sampler = async () => {
      while (Date.now() < productionEnds) {
        await sleep(250);
        await sampleKeys('sample');
      }
    };

    await Promise.all([produce(), chaos(), sampler()]);
    // The last signals may still be going out: the drain waits for them too, as they wake their waits.
    let signalled = false;
    const signalling = Promise.all(waitPlays)
      .then((logs) => {
        expected.waits = logs;
        log(`signals all answered at ${Date.now() - started} ms`);
      })
      .finally(() => (signalled = true));
    // Awaited after the drain; a harness error there must not surface earlier as an unhandled rejection.
    signalling.catch(() => {});

    // Drain: the processes finish the work (no more faults).
    const drainEnds = Date.now() + config.drainMs;
    for (;;) {
      const open = await pool
        .query(`SELECT count(*)::int AS n FROM outlive.tasks WHERE state IN ('pending', 'running') AND run_at <= now() + interval '1 second'`)
        .then((r) => r.rows[0].n as number)
        .catch(() => -1);
      // One slot task may always be in flight while the schedule runs.
      if (open >= 0 && open <= 2 && signalled) break;
      if (Date.now() > drainEnds) {
        log(`drain: ${open} tasks still open after ${config.drainMs} ms; the final recovery takes them`);
        break;
      }
      await sleep(500);
    }

    await signalling;
    log(`drained at ${Date.now() - started} ms`);
    // Stop every process abruptly, as a platform would; nothing is handed back.
    stopping = true;
    for (const c of children) {
      c.killed = true;
      c.proc.kill('SIGKILL');
    }
    await Promise.all(children.map((c) => (c.proc.exitCode !== null || c.proc.signalCode !== null ? null : new Promise((r) => c.proc.once('exit', r)))));
    await signalPool.end();
    await watchPool.end();
    await tcp.close();

    // Final recovery, far in the future: every lease has expired by then. Then
    // passes at that time run what it handed back, until nothing is ready.
    const dbNow = (await pool.query('SELECT now() AS now')).rows[0].now as Date;
    const future = new Date(dbNow.getTime() + 86_400_000);
    let finalRecovered = (await recover(pool, { now: future, limit: 100_000 })).rows.length;
    let finalDrained = 0;
    // An hour apart: recovery's backoff is at most an hour, so what it handed back is due at the first.
    for (let i = 1; i <= 500; i++) {
      const at = new Date(future.getTime() + i * 3_600_000);
      const r = await tick(pool, { tasks: tasks.all, now: at, budgetMs: 60_000, concurrency: 16, leaseGraceMs: 500 });
      finalDrained += r.claimed;
      if (r.claimed === 0) break;
    }
    const checkAt = new Date(future.getTime() + 100 * 3_600_000);
    finalRecovered += (await recover(pool, { now: checkAt, limit: 100_000 })).rows.length;
    await sampleKeys('at the end');
    const check = await checkAll(pool, expected, checkAt);
    if (keySamples === 0) check.violations.push('the keys of chaos.limited were never sampled');
    if (keyViolations.length > 0) check.violations.push(`flow control: ${keyViolations.length} samples where a key's count was off (e.g. ${keyViolations.slice(0, 3).join('; ')})`);
    check.keySamples = keySamples;

    await pool.end();
    await server.stop();
    return {
      seed: config.seed,
      check,
      faults,
      passes,
      unexpectedExits,
      enqueueFailures,
      finalRecovered,
      finalDrained,
      durationMs: Date.now() - started,
    };
  }
}

/** A human summary of a result, with the replay line when something failed. */
export function summarise(result: ChaosResult, replay: string): string {
  const c = result.check;
  const lines = [
    `chaos seed ${result.seed}: ${(result.durationMs / 1000).toFixed(1)} s`,
    `  tasks: ${c.tasks} ${JSON.stringify(c.byState)}; runs: ${c.runs} ${JSON.stringify(c.runsByState)}; schedule slots: ${c.scheduledSlots}`,
    `  faults injected: ${Object.values(result.faults).reduce((a, b) => a + b, 0)} ${JSON.stringify(result.faults)}; enqueues that failed under faults: ${result.enqueueFailures}`,
    `  pass reports of the processes (a killed process's last pass never reports): ${JSON.stringify(result.passes)}`,
    `  executions (side effects): ${c.effects}; tasks re-executed: ${c.reExecutedTasks} (${c.extraExecutions} extra executions); executions whose result was discarded: ${c.discardedExecutions}`,
    `  flow control: ${c.keySamples ?? 0} samples of every key's running count against its running rows and limit`,
    `  final recovery: ${result.finalRecovered} leases recovered, ${result.finalDrained} tasks run by the final passes; well-behaved tasks failed by faults alone: ${c.exhaustedByFaults}`,
  ];
  const w = c.waits;
  if (w) {
    lines.push(
      `  waits: ${w.waitRuns} waiting for a signal, ${w.sleepRuns} sleeping; ${w.signalIds} signal ids in ${w.sends} sends (${w.duplicateCopies} duplicate copies, ${w.answeredDuplicate} answered "duplicate"; ${w.reordered} runs with their two ids reordered, ${w.racing} racing)`,
      `    first answers: ${w.keptBeforeRun} kept before the run started, ${w.keptBeforeWait} kept before the wait began, ${w.deliveredToParked} delivered to a parked wait (${w.sawParked} seen parked first), ${w.extraKept} second ids kept unused; ${w.lostAnswers} answers lost to faults and sent again under the same id (${w.committedUnseen} ids had committed unseen); steps after a wait re-executed by faults: ${w.recordReExecuted}`,
    );
  }
  if (result.unexpectedExits.length > 0) {
    lines.push(`  PROCESSES THAT DIED ON THEIR OWN (${result.unexpectedExits.length}, restarted; see test/connection-loss.test.ts):`);
    for (const e of result.unexpectedExits.slice(0, 3)) lines.push(`    - ${e.split('\n').slice(0, 6).join('\n      ')}`);
  }
  if (c.violations.length === 0) lines.push('  every check of the rows and side effects held');
  else {
    lines.push(`  VIOLATIONS (${c.violations.length}):`);
    for (const v of c.violations) lines.push(`    - ${v}`);
  }
  if (c.violations.length > 0 || result.unexpectedExits.length > 0) lines.push(`  replay: ${replay}`);
  return lines.join('\n');
}
