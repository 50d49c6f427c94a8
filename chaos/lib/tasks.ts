/**
 * The chaos workload's tasks. Every handler writes its side effect to
 * `chaos_effects` (task id, attempt, a token) before it returns, and returns
 * the same token: the checker then knows which execution a settled output
 * came from, and how many executions each task had.
 *
 * What a handler does is decided by its input, which the orchestrator drew
 * from its seeded generator, so a replay with the same seed enqueues the same
 * work.
 */
import type pg from 'pg';
import { z } from 'zod';
import { defineSchedule, defineTask, step } from '../../src/index.js';

/** How a plain task behaves. */
export const MODES = ['ok', 'flaky', 'fail', 'slow', 'hang'] as const;
export type Mode = (typeof MODES)[number];

const behaviour = z.object({
  n: z.number().int(),
  mode: z.enum(MODES),
  /** flaky: attempts below this one throw. */
  failUntil: z.number().int().min(1).default(1),
  /** slow: how long it works (respecting its signal); hang: how long past its timeout it ignores the signal. */
  sleepMs: z.number().int().min(0).default(0),
});
export type Behaviour = z.input<typeof behaviour>;

/** Timeout of the plain tasks: short, so hangs and kills come round quickly. */
export const PLAIN_TIMEOUT_MS = 1_500;
export const PLAIN_MAX_ATTEMPTS = 4;

/** The concurrency of chaos.limited's keys: a tenant's key allows 1. */
export const LIMITED_CONCURRENCY: Record<string, number> = { 'chaos.api': 3 };

/** The effects table: one row per execution that got as far as its side effect. */
export async function createEffects(pool: pg.Pool): Promise<void> {
  await pool.query(`CREATE TABLE IF NOT EXISTS chaos_effects (
    task_id bigint NOT NULL,
    attempt int NOT NULL,
    token uuid NOT NULL,
    kind text NOT NULL,
    pid int NOT NULL,
    detail jsonb,
    at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(`CREATE INDEX IF NOT EXISTS chaos_effects_task_idx ON chaos_effects (task_id)`);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}

/** The task list, handlers writing effects through `pool`. */
export function chaosTasks(pool: pg.Pool) {
  const effect = async (taskId: string, attempt: number, kind: string, detail?: unknown) => {
    const token = globalThis.crypto.randomUUID();
    await pool.query('INSERT INTO chaos_effects (task_id, attempt, token, kind, pid, detail) VALUES ($1, $2, $3, $4, $5, $6::jsonb)', [
      taskId,
      attempt,
      token,
      kind,
      process.pid,
      detail === undefined ? null : JSON.stringify(detail),
    ]);
    return token;
  };

  const plain = defineTask({
    name: 'chaos.plain',
    input: behaviour,
    timeoutMs: PLAIN_TIMEOUT_MS,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    async run({ mode, failUntil, sleepMs }, ctx) {
      if (mode === 'fail') throw new Error('chaos: this task always fails');
      if (mode === 'flaky' && ctx.attempt < failUntil) throw new Error(`chaos: attempt ${ctx.attempt} fails`);
      if (mode === 'slow') await sleep(sleepMs, ctx.signal);
      // Ignores its signal on the first attempt: abandoned at its timeout, it
      // still finishes late and writes its effect while attempt 2 may run.
      if (mode === 'hang' && ctx.attempt === 1) await sleep(PLAIN_TIMEOUT_MS + sleepMs);
      const token = await effect(ctx.taskId, ctx.attempt, 'plain');
      return { token, attempt: ctx.attempt };
    },
  });

  // Flow control under faults: a concurrency shared by all, one per tenant,
  // a rate, and fair turns between tenants (issue 26). The harness samples
  // the keys' counts against the running rows after every fault.
  const limited = defineTask({
    name: 'chaos.limited',
    input: behaviour.extend({ tenant: z.string() }),
    timeoutMs: PLAIN_TIMEOUT_MS,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    limits: [
      { key: 'chaos.api', concurrency: LIMITED_CONCURRENCY['chaos.api']! },
      { key: (i) => `chaos.tenant:${i.tenant}`, concurrency: 1 },
      { key: 'chaos.rate', rate: { limit: 200, periodMs: 1_000 } },
    ],
    fairness: { key: (i) => i.tenant },
    async run({ mode, failUntil, sleepMs }, ctx) {
      if (mode === 'fail') throw new Error('chaos: this task always fails');
      if (mode === 'flaky' && ctx.attempt < failUntil) throw new Error(`chaos: attempt ${ctx.attempt} fails`);
      if (mode === 'slow' || mode === 'hang') await sleep(Math.min(sleepMs, PLAIN_TIMEOUT_MS / 2), ctx.signal);
      const token = await effect(ctx.taskId, ctx.attempt, 'limited');
      return { token, attempt: ctx.attempt };
    },
  });

  const join = defineTask({
    name: 'chaos.join',
    input: z.object({ expect: z.number().int() }),
    timeoutMs: 3_000,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    async run({ expect }, ctx) {
      const outputs = await ctx.outputs();
      const got = Object.keys(outputs).length;
      if (got !== expect) throw new Error(`chaos: join saw ${got} outputs, expected ${expect}`);
      const token = await effect(ctx.taskId, ctx.attempt, 'join');
      return { token, attempt: ctx.attempt, joined: got };
    },
  });

  const fan = defineTask({
    name: 'chaos.fan',
    input: z.object({ children: z.array(behaviour), tail: behaviour.optional() }),
    timeoutMs: 3_000,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    async run({ children, tail }, ctx) {
      const names = children.map((_, i) => `c${i}`);
      children.forEach((c, i) => ctx.spawn(names[i]!, step(plain, c)));
      ctx.spawn('join', step(join, { expect: children.length }, { after: names }));
      // Spawned into steps already in the run: this fan-out itself (the
      // harness names it root), a step started beside it that may be
      // running in another process, and a child spawned in this attempt.
      if (tail) ctx.spawn('tail', step(plain, tail, { after: ['root', 'side', names[0]!] }));
      const token = await effect(ctx.taskId, ctx.attempt, 'fan');
      return { token, attempt: ctx.attempt };
    },
  });

  const scheduled = defineTask({
    name: 'chaos.sched',
    input: z.object({ slot: z.string() }),
    timeoutMs: 3_000,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    async run(_input, ctx) {
      const token = await effect(ctx.taskId, ctx.attempt, 'sched');
      return { token, attempt: ctx.attempt };
    },
  });

  // The step after a wait (issue 27): its effect keeps the output it read, so
  // the checker can tell a wait resumed twice, or with another signal, from
  // a re-execution of the same resume.
  const record = defineTask({
    name: 'chaos.record',
    input: z.object({ of: z.string() }),
    timeoutMs: 3_000,
    retry: { maxAttempts: PLAIN_MAX_ATTEMPTS, backoff: { baseMs: 100, maxMs: 800 } },
    async run({ of }, ctx) {
      const outputs = await ctx.outputs();
      if (!(of in outputs)) throw new Error(`chaos: record saw no output of ${of}`);
      const seen = outputs[of] ?? null;
      const token = await effect(ctx.taskId, ctx.attempt, 'record', { seen });
      return { token, attempt: ctx.attempt, seen };
    },
  });

  /** Fires every second; missed slots are all caught up, so slots must be contiguous. */
  const everySecond = defineSchedule({
    name: 'chaos.every-second',
    cron: '* * * * * *',
    task: scheduled,
    input: (slot: Date) => ({ slot: slot.toISOString() }),
    missed: { catchUp: 1000 },
  });

  return { plain, join, fan, scheduled, limited, record, all: [plain, join, fan, scheduled, limited, record], schedules: [everySecond] };
}
