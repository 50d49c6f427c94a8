/**
 * The tasks this deployment runs: the one module the app owns. The Worker and
 * the Vercel routes import it; the engine never does.
 *
 * Handlers that need the invocation's bindings or its database pool get them
 * from the `deps` argument (on Workers both exist only per request). The app
 * enqueues with the same definitions: enqueue reads only a task's name,
 * schema and defaults, never its handler.
 */
import { z } from 'zod';
import { defineTask } from 'outlive';
import type { TaskDeps, TasksFor } from 'outlive/cloudflare';

/** An example task: answers with its message and the time it ran. */
export const ping = defineTask({
  name: 'ping',
  input: z.object({ message: z.string().max(1_000) }),
  timeoutMs: 5_000,
  run: ({ message }) => ({ pong: message, at: new Date().toISOString() }),
});

/** An example task that writes through the invocation's pool: stamps a row of the app's `pings` table. */
export const stampPing = (deps: TaskDeps) =>
  defineTask({
    name: 'stamp-ping',
    input: z.object({ id: z.string().uuid() }),
    timeoutMs: 5_000,
    async run({ id }, ctx) {
      await deps.pool.query('UPDATE pings SET handled_at = now(), task_id = $2 WHERE id = $1', [id, ctx.taskId]);
    },
  });

/**
 * The tasks every entry point runs, built per invocation. To have the cron
 * tick fire schedules too, return them beside the tasks:
 *
 * ```ts
 * export const tasks: TasksFor = (deps) => ({
 *   tasks: [ping, stampPing(deps)],
 *   schedules: [defineSchedule({ name: 'hourly-ping', cron: '0 * * * *', task: ping, input: { message: 'hourly' } })],
 * });
 * ```
 */
export const tasks: TasksFor = (deps) => [ping, stampPing(deps)];
