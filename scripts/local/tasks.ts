/**
 * The local stack's task module, bundled into the Worker in place of
 * `functions/tasks.ts`: the app's example tasks, the site-import example
 * (writing through the invocation's pool), and a schedule, so the cron tick
 * has something to fire.
 */
import { defineSchedule } from 'outlive';
import type { TasksFor } from 'outlive/cloudflare';
import { ping, stampPing } from '../../functions/tasks.js';
import { siteImportTasks } from '../../examples/site-import.js';

/** Every minute, a ping: shows a schedule's last and next firing on the dashboard. */
export const heartbeat = defineSchedule({ name: 'local-heartbeat', cron: '* * * * *', task: ping, input: { message: 'heartbeat' } });

/** The tasks the local Worker runs, built per invocation. */
export const tasks: TasksFor = (deps) => ({
  tasks: [ping, stampPing(deps), ...siteImportTasks(() => deps.pool).all],
  schedules: [heartbeat],
});
