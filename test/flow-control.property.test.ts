/**
 * The invariants of flow control under any interleaving of claims,
 * settles (of every kind, stale ones included), recoveries, cancels and
 * 429s by concurrent passes: each key's `running` is the number of running
 * tasks that hold it, never more than its concurrency, and no window of a
 * rate's period holds more starts than its limit.
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { z } from 'zod';
import { cancelRun, defineTask, enqueueMany, recover, startRun, step } from '../src/index.js';
import { claim, type ClaimedTask } from '../src/pass/claim.js';
import { settle } from '../src/pass/settle.js';
import type { Outcome } from '../src/pass/execute.js';
import { toExecutor } from '../src/db/executor.js';
import { closePool, freshDb, passPool } from './support/db.js';

const noop = () => undefined;
const both = defineTask({
  name: 'both',
  input: z.object({ n: z.number() }),
  retry: { maxAttempts: 3 },
  limits: [{ key: 'one', concurrency: 1 }, { key: 'five', concurrency: 5 }],
  run: noop,
});
const rated = defineTask({
  name: 'rated',
  input: z.object({ n: z.number() }),
  retry: { maxAttempts: 3 },
  limits: [
    { key: 'five', concurrency: 5 },
    { key: 'rate', rate: { limit: 4, periodMs: 10_000 }, cost: (i) => 1 + (i.n % 2) },
    { key: 'spread', rate: { limit: 6, periodMs: 12_000, burst: 2 }, cost: (i) => 1 + (i.n % 2) },
  ],
  run: noop,
});
const tenant = defineTask({
  name: 'tenant',
  input: z.object({ c: z.string() }),
  retry: { maxAttempts: 3 },
  limits: [{ key: (i) => `c:${i.c}`, concurrency: 2 }],
  fairness: { key: (i) => i.c },
  run: noop,
});
const CONCURRENCY: Record<string, number> = { one: 1, five: 5, 'c:a': 2, 'c:b': 2, 'c:c': 2 };
const RATES = [{ key: 'rate', limit: 4, periodMs: 10_000, burst: null }, { key: 'spread', limit: 6, periodMs: 12_000, burst: 2 }];

type Op =
  | { kind: 'claim'; pass: number; limit: number }
  | { kind: 'settle'; pick: number; as: 'succeeded' | 'pending' | 'failed' | 'released' | 'rate-limited' }
  | { kind: 'stale'; pick: number }
  | { kind: 'recover' }
  | { kind: 'cancel' }
  | { kind: 'time'; ms: number };

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('claim' as const), pass: fc.integer({ min: 0, max: 3 }), limit: fc.integer({ min: 1, max: 6 }) }) },
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('settle' as const),
      pick: fc.nat(),
      as: fc.constantFrom('succeeded' as const, 'pending' as const, 'failed' as const, 'released' as const, 'rate-limited' as const),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('stale' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('recover' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('cancel' as const) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('time' as const), ms: fc.integer({ min: 100, max: 8_000 }) }) },
);

describe('flow control invariants', () => {
  it('hold under any interleaving of concurrent claims, settles, stale settles, recoveries, cancels and 429s', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.array(op, { minLength: 1, maxLength: 3 }), { minLength: 5, maxLength: 25 }), async (rounds) => {
        const db = await freshDb();
        const raw = Array.from({ length: 3 }, () => db.newPool({ max: 2 }));
        const pools = raw.map(passPool);
        const names = ['both', 'rated', 'tenant'];
        let now = Date.now() + 3_600_000;
        const held: (ClaimedTask & { owner: string })[] = [];
        const lost: (ClaimedTask & { owner: string })[] = [];
        const starts: { key: string; at: number; cost: number; id: string; attempt: number }[] = [];
        const runs: string[] = [];
        try {
          await enqueueMany(db.pool, both, Array.from({ length: 8 }, (_, n) => ({ n })));
          await enqueueMany(db.pool, rated, Array.from({ length: 10 }, (_, n) => ({ n })));
          await enqueueMany(db.pool, tenant, ['a', 'a', 'a', 'b', 'b', 'c', 'a', 'b'].map((c) => ({ c })));
          for (let r = 0; r < 3; r++) {
            runs.push((await startRun(db.pool, 'r', { x: step(both, { n: 100 + r }), y: step(tenant, { c: 'a' }, { after: ['x'] }) })).id);
          }
          for (const group of rounds) {
            const at = new Date(now);
            await Promise.all(
              group.map(async (o, i) => {
                const pool = pools[i % pools.length]!;
                if (o.kind === 'claim') {
                  const owner = `pass-${o.pass}-${now}-${i}`;
                  const got = await claim(toExecutor(pool), {
                    owner, limit: o.limit, maxTimeoutMs: 60_000, queues: null, names, leaseGraceMs: 1_000, leaseMs: 30_000, now: at,
                  });
                  for (const t of got) {
                    held.push({ ...t, owner });
                    for (const l of t.limits ?? []) if (l.r !== undefined) starts.push({ key: l.k, at: at.getTime(), cost: l.c ?? 1, id: t.id, attempt: t.attempts });
                  }
                } else if (o.kind === 'settle' && held.length > 0) {
                  const [t] = held.splice(o.pick % held.length, 1);
                  const base = { id: t!.id, runId: t!.run_id, attempt: t!.attempts, governed: true as const };
                  const error = { attempt: t!.attempts, at: at.toISOString(), name: 'Error', message: 'x' };
                  const outcome: Outcome =
                    o.as === 'succeeded' ? { ...base, state: 'succeeded', output: null }
                    : o.as === 'pending' ? { ...base, state: 'pending', retryAt: null, delayMs: 500, error }
                    : o.as === 'failed' ? { ...base, state: 'failed', error }
                    : o.as === 'released' ? { ...base, flow: JSON.stringify({ costs: { '*': 0 } }), state: 'released' }
                    : { ...base, flow: JSON.stringify({ pause: { key: 'five', ms: 2_000, reason: '429' } }), state: 'released' };
                  const rows = await settle(pool, t!.owner, [outcome], at);
                  // A hand-back's rate start never happened.
                  if (rows.length && o.as === 'released') {
                    for (let k = starts.length - 1; k >= 0; k--) if (starts[k]!.id === t!.id && starts[k]!.attempt === t!.attempts) starts.splice(k, 1);
                  }
                } else if (o.kind === 'stale' && lost.length > 0) {
                  const t = lost[o.pick % lost.length]!;
                  const rows = await settle(pool, t.owner, [{ id: t.id, runId: t.run_id, attempt: t.attempts, governed: true, state: 'succeeded', output: null }], at);
                  expect(rows).toEqual([]);
                } else if (o.kind === 'recover') {
                  now += 40_000;
                  const report = await recover(pool, { now: new Date(now) });
                  const gone = new Set(report.rows.map((x) => x.id));
                  for (let k = held.length - 1; k >= 0; k--) if (gone.has(held[k]!.id)) lost.push(...held.splice(k, 1));
                } else if (o.kind === 'cancel' && runs.length > 0) {
                  const run = runs.shift()!;
                  await cancelRun(pool, run, { now: at });
                  const gone = new Set((await db.rows<{ id: string }>(`SELECT id::text FROM outlive.tasks WHERE run_id = $1`, [run])).map((x) => x.id));
                  for (let k = held.length - 1; k >= 0; k--) if (gone.has(held[k]!.id)) lost.push(...held.splice(k, 1));
                } else if (o.kind === 'time') {
                  now += o.ms;
                }
              }),
            );
            const keys = await db.rows<{ key: string; running: number; actual: number }>(`
              SELECT l.key, l.running,
                     (SELECT count(*)::int FROM outlive.tasks t, jsonb_array_elements(t.limits) x
                      WHERE t.state = 'running' AND x->>'k' = l.key) AS actual
              FROM outlive.limits l`);
            for (const k of keys) {
              expect(k.running, `key ${k.key}`).toBe(k.actual);
              if (CONCURRENCY[k.key] !== undefined) expect(k.running, `key ${k.key}`).toBeLessThanOrEqual(CONCURRENCY[k.key]!);
            }
          }
          // No window of the period held more than the limit (by the claims' times), and a
          // burst's starts were spread: any stretch of time holds at most the burst plus one
          // unit per emission interval (periodMs / limit).
          for (const rate of RATES) {
            const times = starts.filter((x) => x.key === rate.key).sort((a, b) => a.at - b.at);
            for (let i = 0; i < times.length; i++) {
              let used = 0;
              for (let j = i; j < times.length && times[j]!.at < times[i]!.at + rate.periodMs; j++) used += times[j]!.cost;
              expect(used, `key ${rate.key}`).toBeLessThanOrEqual(rate.limit);
              if (rate.burst === null) continue;
              let run = 0;
              for (let j = i; j < times.length; j++) {
                run += times[j]!.cost;
                const allowed = (times[j]!.at - times[i]!.at) / (rate.periodMs / rate.limit) + Math.max(rate.burst, 2);
                expect(run, `key ${rate.key}, starts ${i}..${j}`).toBeLessThanOrEqual(allowed + 1e-9);
              }
            }
          }
        } finally {
          await Promise.all(raw.map(closePool));
        }
      }),
      { numRuns: 40 },
    );
  }, 240_000);
});
