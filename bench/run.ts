/**
 * The benchmark of issue 7: outlive side by side with graphile-worker 0.18
 * and pg-boss 12 on one PostgreSQL, in one run.
 *
 *   cd bench && npm install && npm run bench              # full: 3 rounds, ~20-25 min, and ~10 min a round for the flow-control phases (lib/flow.ts)
 *   cd bench && npx tsx run.ts --phases latency,signal-resume,wait-cost,deadlines --rounds 1   # the waits phases (lib/waits.ts) beside the latency phase
 *   cd bench && npm run bench -- --smoke                   # a few hundred jobs, 1 round
 *
 * Each round runs every phase, and within a phase the systems take turns
 * (outlive, outlive-drop, graphile-worker, pg-boss, then again next round),
 * each on a fresh database cloned from its migrated template; outlive-drop
 * (outlive deleting succeeded rows) runs only the drains and the latency
 * phase (takesPart in lib/config.ts). Results go to bench/results/ and, for
 * full runs, into docs/benchmarks.md with plots.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { outliveRuntime, peerRuntime } from './lib/children.ts';
import { FLOW_PHASES, parseArgs, takesPart, WAIT_PHASES, type PhaseName } from './lib/config.ts';
import { describeSystem, dropFlowDatabases, FLOW_STEPS } from './lib/flow.ts';
import { dropWaitDatabases, WAIT_STEPS } from './lib/waits.ts';
import {
  bulkAndDrain,
  claim,
  dag,
  serverless,
  enqueueSingle,
  latency,
  liveness,
  recovery,
  prepareTemplate,
  templateOf,
  type Context,
  type PhaseResult,
  type SystemInfo,
} from './lib/phases.ts';
import { Admin, SERVER_URL } from './lib/postgres.ts';
import { summarize, writeDocs, type RunRecord } from './lib/report.ts';
import { SQL } from './lib/systems.ts';
import type { SystemName } from './systems/protocol.ts';

const BENCH = fileURLToPath(new URL('.', import.meta.url));
const SRC = fileURLToPath(new URL('../src/', import.meta.url));

/**
 * A short hash of the engine's source files, in every folder of src/. The
 * harness measures the working tree, which may change while a run is going;
 * the report says so when the hash differs between rounds.
 */
function sourceHash(): string {
  const hash = createHash('sha1');
  for (const file of readdirSync(SRC, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts')).sort()) {
    hash.update(file).update(readFileSync(`${SRC}/${file}`));
  }
  return hash.digest('hex').slice(0, 10);
}

/** The commit measured, and whether the working tree differed from it; null outside a git checkout. */
function commitMeasured(): string | null {
  try {
    const git = (...args: string[]) => execFileSync('git', args, { cwd: BENCH, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const head = git('rev-parse', '--short', 'HEAD');
    return git('status', '--porcelain', '--untracked-files=no') === '' ? head : `${head} with uncommitted changes`;
  } catch {
    return null;
  }
}

/** One unit of work of a round: which phases it reports, for which systems, and how it runs one system. */
interface Step {
  phases: PhaseName[];
  systems: readonly SystemName[] | 'all';
  run(ctx: Context, system: SystemName, wanted: PhaseName[]): Promise<PhaseResult[]>;
}

const STEPS: Step[] = [
  { phases: ['enqueue-single'], systems: 'all', run: async (ctx, s) => [await enqueueSingle(ctx, s, false)] },
  { phases: ['enqueue-single-tx'], systems: 'all', run: async (ctx, s) => [await enqueueSingle(ctx, s, true)] },
  {
    // The bulk-enqueued jobs are the ones the one-process drain runs.
    phases: ['enqueue-bulk', 'drain-1'],
    systems: 'all',
    run: async (ctx, s, wanted) => {
      const results = await bulkAndDrain(ctx, s, 1, wanted.includes('enqueue-bulk'));
      return results.filter((r) => wanted.includes(r.phase));
    },
  },
  { phases: ['drain-2'], systems: 'all', run: (ctx, s) => bulkAndDrain(ctx, s, 2, false) },
  { phases: ['latency'], systems: 'all', run: async (ctx, s) => [await latency(ctx, s)] },
  { phases: ['claim'], systems: ['outlive'], run: async (ctx, s) => [await claim(ctx, s)] },
  { phases: ['dag'], systems: ['outlive'], run: async (ctx, s) => [await dag(ctx, s, false)] },
  { phases: ['dag-spawn'], systems: ['outlive'], run: async (ctx, s) => [await dag(ctx, s, true)] },
  { phases: ['serverless'], systems: ['outlive'], run: async (ctx, s) => [await serverless(ctx, s)] },
  // outlive-drop sits it out (takesPart): the jobs are still waiting, so how a success settles does not come in.
  { phases: ['liveness'], systems: ['outlive', 'graphile-worker', 'pg-boss'], run: async (ctx, s) => [await liveness(ctx, s)] },
  { phases: ['recovery'], systems: 'all', run: async (ctx, s) => [await recovery(ctx, s)] },
  // Flow control (issue 26, lib/flow.ts): databases of their own (benchflow_*), made from templates of their own.
  ...FLOW_STEPS.map((f): Step => ({ phases: [f.phase], systems: f.systems, run: async (ctx, s) => [await f.run(ctx, s)] })),
  // Waits and signals (issue 27, lib/waits.ts): outlive only, on a database of their own (benchwait_outlive).
  ...WAIT_STEPS.map((f): Step => ({ phases: [f.phase], systems: f.systems, run: async (ctx, s) => [await f.run(ctx, s)] })),
];

function fmt(n: number): string {
  return n >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(2);
}

function line(r: PhaseResult): string {
  const head = `[round ${r.round}] ${r.phase.padEnd(17)} ${r.system.padEnd(15)}`;
  if (r.skipped) return `${head} skipped: ${r.skipped}`;
  const m = r.metrics;
  if (Object.keys(m).length === 0) return `${head} FAILED: ${r.error ?? 'no result'}`;
  let main: string;
  if (r.phase === 'latency') main = `p50 ${fmt(m.p50!)} ms, p95 ${fmt(m.p95!)} ms, p99 ${fmt(m.p99!)} ms`;
  else if (r.phase === 'claim') main = `claim of 10: ${fmt(m.finishedP50!)} ms with finished rows, ${fmt(m.pendingP50!)} ms with pending rows`;
  else if (r.phase.startsWith('dag')) main = `startRun ${fmt(m.startRunMs!)} ms, then ${fmt(m.tasksPerSec!)} tasks/s`;
  else if (r.phase === 'serverless') main = `${fmt(m.tasksPerSec!)} tasks/s in ${m.passes} pass(es), ${fmt(m.messagesPerTask!)} WebSocket messages/task`;
  else if (r.phase === 'liveness') {
    // First the exact counts from the WAL records of this database (pg_walinspect), where
    // the server has them; then what pg_stat_user_tables (which can lag a write by up to
    // 10 s) and the server-wide WAL position (pg_current_wal_lsn) say.
    const exact = (label: string, rows: number | undefined, hot: number | undefined, kb: number | undefined) =>
      rows === undefined ? `${label}: WAL records not counted` : `${label}: ${fmt(rows)} row writes/s (${fmt(hot!)} HOT), this database's WAL ${fmt(kb!)} kB/s`;
    main =
      `${exact(`window ${fmt(m.windowSec!)} s`, m.walRowWritesPerSec, m.walHotPerSec, m.dbWalKBPerSec)}; ` +
      `${exact(`whole wait ${fmt(m.waitSec!)} s`, m.waitWalRowWritesPerSec, m.waitWalHotPerSec, m.waitDbWalKBPerSec)} (from the WAL records)` +
      `\n    pg_stat_user_tables: window ${fmt(m.writesPerSec!)} row writes/s (${fmt(m.hotWritesPerSec!)} HOT), whole wait ${fmt(m.waitWritesPerSec!)} ` +
      `(${fmt(m.waitHotWritesPerSec!)} HOT); server-wide WAL (pg_current_wal_lsn): window ${fmt(m.walKBPerSec!)} kB/s, whole wait ${fmt(m.waitWalKBPerSec!)} kB/s`;
  } else if (r.phase === 'recovery') main = `handed back ${fmt(m.releasedSec!)} s after the kill, all started again after ${fmt(m.rerunSec!)} s`;
  else if (r.phase === 'over-admission') {
    main =
      `most running at once: k1 ${m.k1Max} (limit 1), k5 ${m.k5Max} (limit 5); to the lease's end: k1 ${m.k1MaxLease}, k5 ${m.k5MaxLease}; ${m.kills} kills` +
      (m.slotsLeaked ? `; ${m.slotsLeaked} SLOT(S) LEAKED` : '');
  } else if (r.phase === 'fairness') {
    const p = (k: string) => (m[`${k}P99`] === undefined ? `none of ${m[`${k}Count`]} started` : `p50 ${fmt(m[`${k}P50`]!)} / p99 ${fmt(m[`${k}P99`]!)} ms`);
    main = `B idle ${p('idle')}; loaded ${p('loaded')}` + (m.loadedRatio === undefined ? '' : ` (p99 ${fmt(m.loadedRatio)}x)`);
    if (m.weightedShare !== undefined) main += `; prefetch 0 ${p('prefetch0')}; ${fmt(m.prefetch0Ratio ?? NaN)}x; keys ${p('keys')}; weighted share ${fmt(m.weightedShare * 100)} %`;
  } else if (r.phase === 'rate') {
    main = `rpm max ${m.rpmMax}/${m.rpmLimit}, long run ${fmt(m.rpmLongRunRatio! * 100)} %; tpm max ${fmt(m.tpmMax!)}/${fmt(m.tpmLimit!)}, long run ${fmt(m.tpmLongRunRatio! * 100)} %; ${m.pauseClaims ?? '?'} claims in the 429 pause`;
  } else if (r.phase === 'signal-resume') {
    main =
      `signal commit to next's start p50 ${fmt(m.p50!)} ms, p95 ${fmt(m.p95!)} ms, p99 ${fmt(m.p99!)} ms, max ${fmt(m.max!)} ms` +
      (m.drainP50 === undefined ? '' : `; through the drain p50 ${fmt(m.drainP50)} ms, p99 ${fmt(m.drainP99!)} ms`);
  } else if (r.phase === 'wait-cost') {
    main =
      `idle over ${fmt(m.waits!)} waits + ${fmt(m.sleeps!)} sleeps: ${fmt(m.writesPerSec!)} row writes/s` +
      (m.walRowWritesPerSec === undefined ? '' : ` (WAL records ${fmt(m.walRowWritesPerSec)})`) +
      `, WAL ${fmt(m.walKBPerSec!)} kB/s server-wide (goals <= 2, <= 20${m.goalMet ? ': met' : ': NOT met'})`;
  } else if (r.phase === 'deadlines') {
    main = `${fmt(m.waits!)} deadlines at once: all settled ${fmt(m.allSettledSec!)} s after; plain tasks meanwhile p50 ${fmt(m.stormP50!)} ms, p99 ${fmt(m.stormP99!)} ms`;
  } else if (r.phase === 'claim-cost') {
    main = Object.keys(m)
      .filter((k) => k.startsWith('claimCpu_'))
      .map((k) => `${k.slice('claimCpu_'.length)} ${fmt(m[k]!)}`)
      .join(', ') + ' ms claim CPU per 1,000';
  }
  else main = `${fmt(m.tasksPerSec!)} tasks/s`;
  const per = m.queriesPerTask !== undefined
    ? ` | ${fmt(m.queriesPerTask)} queries, ${fmt(m.commitsPerTask!)} commits/task, PG CPU ${m.pgCpuMsPer1k === undefined ? '?' : fmt(m.pgCpuMsPer1k)} ms/1k`
    : '';
  const notes = (r.notes ?? []).map((n) => `\n    ${n}`).join('');
  return `${head} ${main}${per}${notes}${r.error ? `\n    ERROR: ${r.error}` : ''}`;
}

async function main(): Promise<void> {
  const options = parseArgs(process.argv.slice(2));
  if (options.from) {
    const record = JSON.parse(readFileSync(options.from, 'utf8')) as RunRecord;
    console.log(summarize(record));
    console.log(`bench: wrote ${(await writeDocs(record)).join(', ')}`);
    return;
  }
  const started = new Date();
  const commit = commitMeasured();
  const outlive = outliveRuntime();
  const peer = peerRuntime();
  console.log(`bench: ${options.smoke ? 'smoke' : 'full'} run, ${options.rounds} round(s), server ${SERVER_URL.replace(/:[^:@/]*@/, ':***@')}`);
  console.log(`bench: outlive on Node ${outlive.version} (${outlive.execPath}); peers on Node ${peer.version} (${peer.execPath})`);

  const admin = await Admin.connect();
  const ctx: Context = { admin, sizes: options.sizes, round: 0, live: new Set() };
  const results: PhaseResult[] = [];
  const versions: Partial<Record<SystemName, SystemInfo>> = {};
  const load: number[][] = [os.loadavg()];
  const sources: string[] = [];
  const stopAll = async () => {
    for (const child of ctx.live) await child.stop().catch(() => undefined);
    ctx.live.clear();
  };
  const onSignal = () => {
    void stopAll().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  try {
    // The templates are independent: install them side by side. The flow phases make their own
    // (lib/flow.ts); a run of only those asks each system for its description alone.
    const standard = options.phases.some((p) => !FLOW_PHASES.includes(p) && !WAIT_PHASES.includes(p));
    await Promise.all(
      options.systems.map(async (system) => {
        if (standard) {
          versions[system] = await prepareTemplate(ctx, system);
          console.log(`bench: ${system} ${versions[system]!.version} on Node ${versions[system]!.node}: template ${templateOf(system)} ready`);
        } else if ([...FLOW_STEPS, ...WAIT_STEPS].some((f) => options.phases.includes(f.phase) && f.systems.includes(system))) {
          versions[system] = await describeSystem(ctx, system);
        }
      }),
    );
    for (let round = 1; round <= options.rounds; round++) {
      ctx.round = round;
      sources.push(sourceHash());
      for (const step of STEPS) {
        const wanted = step.phases.filter((p) => options.phases.includes(p));
        if (wanted.length === 0) continue;
        for (const system of options.systems) {
          if (step.systems !== 'all' && !step.systems.includes(system)) continue;
          // A step may report several phases, not all of which this system takes part in.
          const mine = wanted.filter((p) => takesPart(system, p));
          if (mine.length === 0) continue;
          const t0 = performance.now();
          try {
            for (const r of await step.run(ctx, system, mine)) {
              results.push(r);
              console.log(`${line(r)}  (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
            }
          } catch (err) {
            await stopAll();
            const message = err instanceof Error ? err.message : String(err);
            for (const phase of mine) {
              const r: PhaseResult = { phase, system, round, metrics: {}, error: message };
              results.push(r);
              console.log(line(r));
            }
          } finally {
            await admin.drop(SQL[system].db).catch(() => undefined);
          }
        }
      }
      load.push(os.loadavg());
    }
  } finally {
    await stopAll();
    for (const system of options.systems) {
      await admin.drop(SQL[system].db).catch(() => undefined);
      await admin.drop(templateOf(system)).catch(() => undefined);
    }
    await dropFlowDatabases(admin);
    await dropWaitDatabases(admin);
  }

  const server = await admin.serverInfo();
  await admin.close();
  const record: RunRecord = {
    startedAt: started.toISOString(),
    finishedAt: new Date().toISOString(),
    options,
    machine: {
      cpu: os.cpus()[0]?.model ?? 'unknown',
      cores: os.cpus().length,
      memoryGiB: Math.round(os.totalmem() / 2 ** 30),
      os: `${os.type()} ${os.release()}`,
      loadavg: load,
    },
    server,
    runtimes: { outlive: outlive.version, peers: peer.version },
    sources,
    commit,
    versions,
    results,
  };
  mkdirSync(`${BENCH}/results`, { recursive: true });
  const file = `${BENCH}/results/${started.toISOString().replace(/[:.]/g, '-')}${options.smoke ? '-smoke' : ''}.json`;
  writeFileSync(file, JSON.stringify(record, null, 2));
  console.log(`\nbench: raw results in ${file}`);
  console.log(summarize(record));
  if (options.writeDocs) {
    const written = await writeDocs(record);
    console.log(`bench: wrote ${written.join(', ')}`);
  }
  const failed = results.filter((r) => r.error);
  if (failed.length > 0) {
    console.error(`bench: ${failed.length} phase run(s) failed`);
    process.exitCode = 1;
  }
}

await main();
