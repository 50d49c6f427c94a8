/**
 * Sizes of the phases and the command line.
 */
import { SYSTEMS, type SystemName } from '../systems/protocol.ts';

/** How big each phase is. */
export interface Sizes {
  enqueueSingle: number;
  /** Jobs of the enqueue-one-per-call-in-a-transaction phase (fewer: it measures the same per-call cost plus BEGIN and COMMIT). */
  enqueueSingleTx: number;
  /** Jobs of the bulk-enqueue phase, which the one-process drain then runs (and of the two-process drain). */
  drain: number;
  /** Jobs per bulk call; the whole phase in one call by default. */
  bulkChunk: number;
  /** Handlers at once per worker process in the drain and latency phases. */
  concurrency: number;
  latencyCount: number;
  latencySpacingMs: number;
  /** How long the worker sits idle before the first latency job, so it is waiting, not still starting. */
  latencyIdleMs: number;
  claimFinished: number;
  /** Ready rows beside the finished ones (enough for every timed claim to find work). */
  claimPendingBesideFinished: number;
  claimPending: number;
  claimReps: number;
  claimLimit: number;
  /** Tasks fanned out between the root and the join of the DAG phases. */
  dagLeaves: number;
  /** Jobs drained through the Cloudflare Worker in Miniflare. */
  serverlessTasks: number;
  /** Liveness phase: jobs run at once by one process (its concurrency is this too). */
  livenessTasks: number;
  /** How long each liveness job's handler waits before it returns, in ms. */
  livenessSleepMs: number;
  /** The measured window while they all wait, in ms (it must end before the first of them can finish). */
  livenessWindowMs: number;
  /** Recovery phase: jobs running in the process that is killed. */
  recoveryTasks: number;
  /** The flow-control phases (issue 26, lib/flow.ts): see {@link FlowSizes}. */
  flow: FlowSizes;
  /** The waits phases (issue 27, lib/waits.ts): see {@link WaitSizes}. */
  waits: WaitSizes;
}

/** Sizes of the waits phases (counts scaled by --scale; the worker's concurrency and spacing are the latency phase's). */
export interface WaitSizes {
  /** signal-resume: runs of { w: waitFor, next } parked, then signalled one at a time, latencySpacingMs apart. */
  signalRuns: number;
  /** signal-resume: also through the drain (a signed nudge to the Cloudflare Worker in Miniflare after each signal). */
  signalDrain: boolean;
  /** wait-cost: runs of one parked waitFor, and of one parked sleepStep, both an hour long. */
  costWaits: number;
  costSleeps: number;
  /** wait-cost: the window the idle worker is measured over, ms (scaled too, at least 10 s). */
  costWindowMs: number;
  /** deadlines: parked waits whose deadline is moved to one instant, half onTimeout { value: null }, half failing. */
  deadlineWaits: number;
  /** Writing the runs: startRun calls per transaction, and connections writing at once. */
  writeChunk: number;
  writeConnections: number;
  /** Parking them: the concurrency of the tick() passes that begin them (a claim takes up to twice this). */
  parkConcurrency: number;
}

/** The issue's sizes (issue 27). */
export const WAITS_FULL: WaitSizes = {
  signalRuns: 200,
  signalDrain: true,
  costWaits: 100_000,
  costSleeps: 100_000,
  costWindowMs: 60_000,
  deadlineWaits: 100_000,
  writeChunk: 1_000,
  writeConnections: 3,
  parkConcurrency: 500,
};

/** Smoke: the same shapes, small. */
export const WAITS_SMOKE: WaitSizes = {
  ...WAITS_FULL,
  signalRuns: 20,
  costWaits: 1_000,
  costSleeps: 1_000,
  costWindowMs: 10_000,
  deadlineWaits: 1_000,
};

/** Sizes of the flow-control phases (not changed by --scale). */
export interface FlowSizes {
  /** over-admission: processes claiming at once (a killed one is replaced), each with this concurrency. */
  admissionProcesses: number;
  admissionConcurrency: number;
  /** How long they run, in ms, and how often one of them is SIGKILLed. */
  admissionMs: number;
  admissionKillEveryMs: number;
  /** Backlog of key k1 (concurrency 1) and k5 (concurrency 5): more than can run in the phase. */
  admissionK1: number;
  admissionK5: number;
  /** outlive's tasks' timeout and the passes' lease grace: a dead process's tasks are handed back 3 s after their claim. */
  admissionTimeoutMs: number;
  admissionLeaseGraceMs: number;
  /** fairness: tenant A's backlog, enqueued first; every task holds this long. */
  fairA: number;
  fairHoldMs: number;
  /** Worker processes x concurrency (saturated by A's backlog). */
  fairWorkers: number;
  fairConcurrency: number;
  /** Tenant B: one task every fairSpacingMs, fairB of them while A's backlog runs, fairIdle on an idle queue. */
  fairSpacingMs: number;
  fairB: number;
  fairIdle: number;
  /** How long the phase waits for B's last tasks after the last enqueue; a B task not started by then "did not start". */
  fairWaitMs: number;
  /** The variant with A's tasks spread over this many concurrency keys (concurrency 1 each). */
  fairKeys: number;
  /** The weighted variant: B weighted 3 to A's 1, both with backlogs; share of starts over a window after a warm-up. */
  fairWeight: number;
  fairWeightedA: number;
  fairWeightedB: number;
  fairWeightedWarmMs: number;
  fairWeightedWindowMs: number;
  /** rate: processes (createWorker) and their concurrency. */
  rateProcesses: number;
  rateConcurrency: number;
  /** Key rpm: rateRpm starts per ratePeriodMs; key tpm: rateTpm tokens per period, each task estimating rateEst[0]..rateEst[1]. */
  ratePeriodMs: number;
  rateRpm: number;
  rateTpm: number;
  rateEst: [number, number];
  /** How long the workers run (a few whole periods and a little more). */
  rateMs: number;
  /** Key provider (concurrency rateProviderConcurrency, tasks holding rateProviderHoldMs): one handler throws a 429 at rate429AtMs. */
  rateProviderConcurrency: number;
  rateProviderHoldMs: number;
  rate429AtMs: number;
  rateRetryAfterMs: number;
  /** claim-cost: key counts sharing costBacklog tasks; one key holding costOneKey; tasks claimed per variant, claimLimit per claim. */
  costKeys: number[];
  costBacklog: number;
  costOneKey: number;
  costMeasure: number;
  costLimit: number;
  /** The last variant: the one key's concurrency cut to this, so that each claim finds it full. */
  costFullConcurrency: number;
}

/** The issue's flow-control sizes (issue 26); the rate phase alone takes a little over 3 minutes. */
export const FLOW_FULL: FlowSizes = {
  admissionProcesses: 10,
  admissionConcurrency: 10,
  admissionMs: 60_000,
  admissionKillEveryMs: 8_000,
  admissionK1: 5_000,
  admissionK5: 20_000,
  admissionTimeoutMs: 2_000,
  admissionLeaseGraceMs: 1_000,
  fairA: 100_000,
  fairHoldMs: 50,
  fairWorkers: 2,
  fairConcurrency: 10,
  fairSpacingMs: 100,
  fairB: 200,
  fairIdle: 100,
  fairWaitMs: 3_000,
  fairKeys: 1_000,
  fairWeight: 3,
  fairWeightedA: 20_000,
  fairWeightedB: 15_000,
  fairWeightedWarmMs: 3_000,
  fairWeightedWindowMs: 15_000,
  rateProcesses: 10,
  rateConcurrency: 10,
  ratePeriodMs: 60_000,
  rateRpm: 60,
  rateTpm: 200_000,
  rateEst: [1_000, 4_000],
  rateMs: 185_000,
  rateProviderConcurrency: 5,
  rateProviderHoldMs: 100,
  rate429AtMs: 30_000,
  rateRetryAfterMs: 20_000,
  costKeys: [1, 100, 10_000],
  costBacklog: 50_000,
  costOneKey: 100_000,
  costMeasure: 5_000,
  costLimit: 50,
  costFullConcurrency: 10,
};

/** Smoke: the same shapes, in seconds (a rate period of 2 s). */
export const FLOW_SMOKE: FlowSizes = {
  admissionProcesses: 3,
  admissionConcurrency: 10,
  admissionMs: 6_000,
  admissionKillEveryMs: 2_500,
  admissionK1: 300,
  admissionK5: 1_500,
  admissionTimeoutMs: 2_000,
  admissionLeaseGraceMs: 1_000,
  fairA: 2_000,
  fairHoldMs: 50,
  fairWorkers: 2,
  fairConcurrency: 10,
  fairSpacingMs: 100,
  fairB: 20,
  fairIdle: 10,
  fairWaitMs: 1_000,
  fairKeys: 100,
  fairWeight: 3,
  fairWeightedA: 1_000,
  fairWeightedB: 1_000,
  fairWeightedWarmMs: 500,
  fairWeightedWindowMs: 1_500,
  rateProcesses: 3,
  rateConcurrency: 10,
  ratePeriodMs: 2_000,
  rateRpm: 6,
  rateTpm: 20_000,
  rateEst: [1_000, 4_000],
  rateMs: 6_500,
  rateProviderConcurrency: 5,
  rateProviderHoldMs: 50,
  rate429AtMs: 1_500,
  rateRetryAfterMs: 2_000,
  costKeys: [1, 10, 100],
  costBacklog: 1_000,
  costOneKey: 3_000,
  costMeasure: 300,
  costLimit: 50,
  costFullConcurrency: 10,
};

/** The issue's sizes (issue 7). */
export const FULL: Sizes = {
  enqueueSingle: 10_000,
  enqueueSingleTx: 2_000,
  drain: 100_000,
  bulkChunk: 100_000,
  concurrency: 10,
  latencyCount: 200,
  latencySpacingMs: 20,
  latencyIdleMs: 1_000,
  claimFinished: 1_000_000,
  claimPendingBesideFinished: 10_000,
  claimPending: 100_000,
  claimReps: 200,
  claimLimit: 10,
  dagLeaves: 10_000,
  serverlessTasks: 5_000,
  livenessTasks: 1_000,
  livenessSleepMs: 20_000,
  livenessWindowMs: 10_000,
  recoveryTasks: 1_000,
  flow: FLOW_FULL,
  waits: WAITS_FULL,
};

/** A few hundred jobs, one round: keeps the harness from rotting in CI; its numbers mean nothing. */
export const SMOKE: Sizes = {
  enqueueSingle: 300,
  enqueueSingleTx: 100,
  drain: 300,
  bulkChunk: 300,
  concurrency: 10,
  latencyCount: 20,
  latencySpacingMs: 20,
  latencyIdleMs: 300,
  claimFinished: 10_000,
  claimPendingBesideFinished: 1_000,
  claimPending: 3_000,
  claimReps: 20,
  claimLimit: 10,
  dagLeaves: 200,
  serverlessTasks: 100,
  // 5 s, not 2: the window starts 1.5 s after all are running (statistics
  // flush, see lib/phases.ts) and must end before the first job can finish.
  livenessTasks: 20,
  livenessSleepMs: 5_000,
  livenessWindowMs: 1_000,
  recoveryTasks: 20,
  flow: FLOW_SMOKE,
  waits: WAITS_SMOKE,
};

/** The phases, in the order a round runs them. */
export const PHASES = [
  'enqueue-single',
  'enqueue-single-tx',
  'enqueue-bulk',
  'drain-1',
  'drain-2',
  'latency',
  'claim',
  'dag',
  'dag-spawn',
  'serverless',
  'liveness',
  'recovery',
  'over-admission',
  'fairness',
  'rate',
  'claim-cost',
  'signal-resume',
  'wait-cost',
  'deadlines',
] as const;
export type PhaseName = (typeof PHASES)[number];

/** The flow-control phases (issue 26, lib/flow.ts): they use databases of their own (benchflow_*) and a section of their own in docs/benchmarks.md. */
export const FLOW_PHASES: readonly PhaseName[] = ['over-admission', 'fairness', 'rate', 'claim-cost'];

/** The waits phases (issue 27, lib/waits.ts), outlive only: databases of their own (benchwait_*) and a section of their own in docs/benchmarks.md. */
export const WAIT_PHASES: readonly PhaseName[] = ['signal-resume', 'wait-cost', 'deadlines'];

/**
 * Systems that take part in only some of the phases. outlive-drop differs
 * from outlive only in how a success settles, so it runs where settles are
 * measured: the enqueues and the claim would measure outlive again, DAG
 * tasks are steps of runs (always kept), and the serverless phase runs the
 * Worker's own task list (systems/worker-tasks.ts).
 */
const ONLY: Partial<Record<SystemName, readonly PhaseName[]>> = {
  'outlive-drop': ['drain-1', 'drain-2', 'latency'],
};

/**
 * Phases a system sits out. graphile-worker leaves a crashed worker's jobs
 * locked for 4 hours: the recovery phase would have nothing to time.
 */
const NEVER: Partial<Record<SystemName, readonly PhaseName[]>> = {
  // over-admission compares pg-boss's groupConcurrency; graphile-worker has no per-key limit beyond its serial job queues.
  'graphile-worker': ['recovery', 'over-admission'],
};

/** Whether `system` takes part in `phase` (phases run by one system alone say so in run.ts). */
export function takesPart(system: SystemName, phase: PhaseName): boolean {
  return (ONLY[system]?.includes(phase) ?? true) && !NEVER[system]?.includes(phase);
}

/** What one invocation runs. */
export interface Options {
  smoke: boolean;
  rounds: number;
  sizes: Sizes;
  phases: PhaseName[];
  systems: SystemName[];
  /** Write docs/benchmarks.md and its images (default for full runs, not for --smoke). */
  writeDocs: boolean;
  /** A note printed at the top of the results (e.g. about the machine's load). */
  note: string;
  /** Re-render docs/benchmarks.md from this saved run (bench/results/*.json) instead of running. */
  from: string | null;
}

const USAGE = `usage: npm run bench -- [options]

  --smoke             a few hundred jobs, one round (for CI; writes no docs)
  --rounds N          rounds (default 3; each round runs every system on every phase)
  --scale F           multiply every job count by F (e.g. 0.2 for a quicker look); for the waits phases also
                      their counts and the wait-cost window (at least 10 s): --scale 0.02 is a smoke run of them
  --phases a,b        only these phases: ${PHASES.join(', ')}
  --systems a,b       only these systems: ${SYSTEMS.join(', ')}
                      (outlive-drop, outlive deleting succeeded rows, runs drain-1, drain-2, latency only;
                      liveness runs outlive, graphile-worker and pg-boss; recovery outlive and pg-boss;
                      flow control: over-admission outlive and pg-boss, fairness all three, rate and claim-cost outlive;
                      waits: signal-resume, wait-cost, deadlines outlive)
  --docs / --no-docs  write docs/benchmarks.md and its images (default: on, off with --smoke)
  --note TEXT         a note to print above the results
  --from FILE         measure nothing: rewrite docs/benchmarks.md from a saved run (bench/results/*.json)
`;

function list<T extends string>(value: string | undefined, allowed: readonly T[], flag: string): T[] {
  const items = (value ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  for (const item of items) {
    if (!allowed.includes(item as T)) throw new Error(`bench: ${flag} takes ${allowed.join(', ')}; got "${item}"\n\n${USAGE}`);
  }
  if (items.length === 0) throw new Error(`bench: ${flag} needs a value\n\n${USAGE}`);
  return items as T[];
}

/** Parses the command line; throws with the usage on a mistake. */
export function parseArgs(argv: readonly string[]): Options {
  let smoke = false;
  let rounds: number | null = null;
  let scale = 1;
  let phases: PhaseName[] = [...PHASES];
  let systems: SystemName[] = [...SYSTEMS];
  let writeDocs: boolean | null = null;
  let note = '';
  let from: string | null = null;
  for (let k = 0; k < argv.length; k++) {
    const arg = argv[k]!;
    const value = () => {
      const v = argv[++k];
      if (v === undefined) throw new Error(`bench: ${arg} needs a value\n\n${USAGE}`);
      return v;
    };
    switch (arg) {
      case '--smoke':
        smoke = true;
        break;
      case '--rounds':
        rounds = Number(value());
        if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`bench: --rounds takes a whole number >= 1\n\n${USAGE}`);
        break;
      case '--scale':
        scale = Number(value());
        if (!(scale > 0)) throw new Error(`bench: --scale takes a positive number\n\n${USAGE}`);
        break;
      case '--phases':
        phases = list(value(), PHASES, '--phases');
        break;
      case '--systems':
        systems = list(value(), SYSTEMS, '--systems');
        break;
      case '--docs':
        writeDocs = true;
        break;
      case '--no-docs':
        writeDocs = false;
        break;
      case '--note':
        note = value();
        break;
      case '--from':
        from = value();
        break;
      case '--help':
      case '-h':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        throw new Error(`bench: unknown option ${arg}\n\n${USAGE}`);
    }
  }
  const base = smoke ? SMOKE : FULL;
  const scaled = (n: number) => Math.max(10, Math.round(n * scale));
  const sizes: Sizes = {
    ...base,
    enqueueSingle: scaled(base.enqueueSingle),
    enqueueSingleTx: scaled(base.enqueueSingleTx),
    bulkChunk: scaled(base.bulkChunk),
    drain: scaled(base.drain),
    latencyCount: scaled(base.latencyCount),
    claimFinished: scaled(base.claimFinished),
    claimPendingBesideFinished: Math.max(scaled(base.claimPendingBesideFinished), base.claimReps * base.claimLimit),
    claimPending: scaled(base.claimPending),
    dagLeaves: scaled(base.dagLeaves),
    serverlessTasks: scaled(base.serverlessTasks),
    livenessTasks: scaled(base.livenessTasks),
    recoveryTasks: scaled(base.recoveryTasks),
    waits: {
      ...base.waits,
      signalRuns: scaled(base.waits.signalRuns),
      costWaits: scaled(base.waits.costWaits),
      costSleeps: scaled(base.waits.costSleeps),
      costWindowMs: Math.max(10_000, Math.round(base.waits.costWindowMs * Math.min(1, scale))),
      deadlineWaits: scaled(base.waits.deadlineWaits),
    },
  };
  return {
    smoke,
    rounds: rounds ?? (smoke ? 1 : 3),
    sizes,
    phases: PHASES.filter((p) => phases.includes(p)),
    systems: SYSTEMS.filter((s) => systems.includes(s)),
    writeDocs: writeDocs ?? !smoke,
    note,
    from,
  };
}
