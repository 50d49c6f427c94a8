/**
 * `npm run chaos [-- --seed N] [-- --quick]`: the full chaos run (or the
 * CI-sized one with --quick). Prints a summary; on a violation, prints the
 * seed and the command that replays it, and exits 1.
 */
import { runChaos, summarise, type ChaosConfig } from './lib/harness.js';
import { seedFromArgs } from './lib/prng.js';

/** The full run: tens of thousands of tasks over a few minutes. */
export const FULL: Omit<ChaosConfig, 'seed'> = {
  durationMs: 180_000,
  plainTasks: 30_000,
  runs: 1_500,
  waitRuns: 1_200,
  fanout: [3, 12],
  workers: 4,
  tickers: 3,
  faultEveryMs: 2_500,
  faults: { kill: 3, terminate: 2, drop: 2, stall: 2, restart: 1, backdate: 3, cronStorm: 2 },
  drainMs: 120_000,
  dataDir: '.data/chaos-pg',
};

/** The CI-sized run of test/chaos.test.ts. */
export const QUICK: Omit<ChaosConfig, 'seed'> = {
  durationMs: 25_000,
  plainTasks: 1_200,
  runs: 40,
  waitRuns: 60,
  fanout: [2, 6],
  workers: 2,
  tickers: 2,
  faultEveryMs: 1_500,
  faults: { kill: 3, terminate: 2, drop: 2, stall: 2, restart: 1, backdate: 3, cronStorm: 2 },
  drainMs: 40_000,
  dataDir: '.data/chaos-pg-quick',
};

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const seed = seedFromArgs(process.argv);
  const quick = process.argv.includes('--quick');
  const verbose = process.argv.includes('--verbose');
  const config = { ...(quick ? QUICK : FULL), seed, log: verbose ? (l: string) => console.log(l) : undefined };
  console.log(`chaos: seed ${seed} (${quick ? 'quick' : 'full'} run)`);
  const result = await runChaos(config);
  console.log(summarise(result, `npm run chaos -- --seed ${seed}${quick ? ' --quick' : ''}`));
  process.exit(result.check.violations.length === 0 && result.unexpectedExits.length === 0 ? 0 : 1);
}
