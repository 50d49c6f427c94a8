/**
 * The tasks module the tests build the Worker with, in place of the app's
 * `functions/tasks.ts` (the bundler swaps one for the other), and the Vercel
 * routes are made with. Each handler writes its effect to the `effects` table
 * (see `tasks.ts`), whose unique constraint proves it ran once.
 */
import { z } from 'zod';
import { defineTask } from '../../src/model/task.js';
import type { TasksFor } from '../../src/http/invocation.js';

/** Something to run queries on: the invocation's pool in a function, nothing when only enqueueing. */
interface Queryable {
  query(text: string, params?: unknown[]): Promise<unknown>;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

/** The test tasks, handlers writing through `db` (null: for enqueueing only). */
export function definitions(db: Queryable | null) {
  const effect = async (taskId: string, label: string) => {
    if (!db) throw new Error('these definitions are for enqueueing only');
    await db.query('INSERT INTO effects (task_id, label) VALUES ($1, $2)', [taskId, label]);
  };
  return {
    /** Records one effect, after `sleepMs` if given. */
    record: defineTask({
      name: 'fn-record',
      input: z.object({ n: z.number().int(), sleepMs: z.number().int().min(0).optional() }),
      timeoutMs: 5_000,
      async run({ n, sleepMs }, ctx) {
        if (sleepMs) await sleep(sleepMs, ctx.signal);
        await effect(ctx.taskId, String(n));
        return { n };
      },
    }),
    /** As `record`, with a timeout short enough for small test budgets. */
    quick: defineTask({
      name: 'fn-quick',
      input: z.object({ n: z.number().int(), sleepMs: z.number().int().min(0) }),
      timeoutMs: 1_000,
      async run({ n, sleepMs }, ctx) {
        await sleep(sleepMs, ctx.signal);
        await effect(ctx.taskId, String(n));
        return { n };
      },
    }),
    /** Hangs on its first attempt (until its signal fires); records an effect on later ones. */
    hang: defineTask({
      name: 'fn-hang',
      input: z.object({}),
      timeoutMs: 10_000,
      retry: { maxAttempts: 3 },
      async run(_input, ctx) {
        if (ctx.attempt === 1) {
          await effect(ctx.taskId, 'started');
          await sleep(60_000, ctx.signal);
        }
        await effect(ctx.taskId, `attempt-${ctx.attempt}`);
        return { attempt: ctx.attempt };
      },
    }),
    /** Runs a query that fails, as a handler's own mistake, then records an effect. */
    failedQuery: defineTask({
      name: 'fn-failed-query',
      input: z.object({}),
      timeoutMs: 5_000,
      async run(_input, ctx) {
        const err = await db!.query('SELECT 1 / 0').then(
          () => null,
          (e: Error) => e,
        );
        await effect(ctx.taskId, err ? 'query failed' : 'query answered');
      },
    }),
    /** Declares a timeout longer than any test budget: never claimed by them. */
    long: defineTask({
      name: 'fn-long',
      input: z.object({}),
      timeoutMs: 60_000,
      async run(_input, ctx) {
        await effect(ctx.taskId, 'long');
      },
    }),
  };
}

/** The task list, as `functions/tasks.ts` exports it. */
export const tasks: TasksFor = ({ pool }) => Object.values(definitions(pool));
