/**
 * The chaos suite, CI-sized: worker and tick processes over a mixed workload
 * on an embedded PostgreSQL this test starts itself, with every fault of the
 * full run (SIGKILL, pg_terminate_backend, a dropping and stalling proxy, a
 * PostgreSQL restart, backdated leases, the same cron slot fired from four
 * places), with runs that wait for signals sent before, during and after
 * their waits, duplicated, reordered and cut mid-flight (chaos/lib/waits.ts),
 * then the checks of chaos/lib/check.ts. Seeded: CHAOS_SEED replays
 * a run (`npm run chaos -- --quick --seed N` does the same outside vitest).
 */
import { describe, expect, it } from 'vitest';
import { runChaos, summarise } from '../chaos/lib/harness.js';
import { QUICK } from '../chaos/run.js';

const seed = Number(process.env.CHAOS_SEED ?? 20261129) >>> 0;

describe(`chaos (seed ${seed}; replay: npm run chaos -- --quick --seed ${seed})`, () => {
  it('loses nothing, settles every task once, resumes every wait once with its first signal, and keeps runs and schedule slots consistent under faults', async () => {
    const result = await runChaos({ ...QUICK, seed, dataDir: `.data/chaos-pg-test-${process.pid}` });
    const summary = summarise(result, `npm run chaos -- --quick --seed ${seed}`);
    console.log(summary);
    expect(result.check.tasks).toBeGreaterThan(500);
    // Every kind of fault was injected at least once.
    expect(Object.keys(result.faults).sort()).toEqual(['backdate', 'cronStorm', 'drop', 'kill', 'restart', 'stall', 'terminate']);
    // Signals reached waits every way the issue names: kept before their run, delivered to a parked wait, duplicated, a second id after the first.
    const waits = result.check.waits!;
    expect(waits.waitRuns, summary).toBeGreaterThan(20);
    expect(waits.keptBeforeRun, summary).toBeGreaterThan(0);
    expect(waits.deliveredToParked, summary).toBeGreaterThan(0);
    expect(waits.answeredDuplicate, summary).toBeGreaterThan(0);
    expect(waits.extraKept, summary).toBeGreaterThan(0);
    // The guarantees, read from the rows and the side-effect table.
    expect(result.check.violations, summary).toEqual([]);
    // No process may die of a fault it should have survived (see test/connection-loss.test.ts).
    expect(result.unexpectedExits.map((e) => e.split('\n')[0]), summary).toEqual([]);
  }, 170_000);
});
