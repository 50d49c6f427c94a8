/**
 * The app's tasks, shared by the code that enqueues (app/api/signup) and the
 * routes that run them (app/api/cron, drain, dashboard).
 */
import { z } from 'zod';
import { defineTask } from 'outlive';
import type { TasksFor } from 'outlive/vercel';

/** Welcomes a new user; its output is kept as the task's history. */
export const sendWelcome = defineTask({
  name: 'send-welcome',
  input: z.object({ userId: z.number().int(), email: z.string().email() }),
  async run({ userId, email }, ctx) {
    return { userId, sent: email, attempt: ctx.attempt };
  },
});

/** What the routes run, built per invocation (a handler may use `deps.pool`). */
export const tasks: TasksFor = () => [sendWelcome];
