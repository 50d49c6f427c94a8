/**
 * `outlive/cloudflare`: the Worker's handlers. `scheduled` runs the cron
 * tick, `fetch` serves `POST /drain` and `/dashboard`. An app's Worker is
 * two lines (an entry module may export nothing but handlers):
 *
 * ```ts
 * import { createCloudflareWorker } from 'outlive/cloudflare';
 * import { tasks } from './tasks.js';
 * export default createCloudflareWorker(tasks);
 * ```
 *
 * Each event opens its own Neon pool and closes it through `ctx.waitUntil`:
 * a WebSocket opened for one request cannot serve another on Workers.
 */
import { toError } from '../model/errors.js';
import { handleDashboard } from './dashboard/index.js';
import { cronPass } from './cron.js';
import { handleDrain } from './drain.js';
import { json, openInvocation, type FunctionsEnv, type TasksFor } from './invocation.js';

// Budgets, well inside what Workers allow (the pass returns by its budget,
// plus its last settles and the pool's close):
// - a cron event may use 30 s of CPU by default (its wall time may be longer,
//   but a pass is mostly waiting on I/O, so wall time is the bound we can
//   keep): 25 s leaves 5 s for recovery, settles and closing;
// - the drain runs its pass in `ctx.waitUntil`, which is cut 30 s after the
//   response: 20 s leaves 10 s. A synchronous drain (no `Prefer:
//   respond-async`) has no such cut while its client waits, but uses the
//   same budget so a client timeout cannot strand a longer pass.
// `OUTLIVE_BUDGET_MS` may lower either, never raise it.
/** The cron tick's budget ceiling on Workers (ms). */
export const SCHEDULED_BUDGET_MS = 25_000;
/** The drain pass's budget ceiling on Workers (ms). */
export const DRAIN_BUDGET_MS = 20_000;

/** The part of Workers' `ScheduledController` the Worker reads. */
export interface ScheduledController {
  readonly cron: string;
  readonly scheduledTime: number;
}

/** The part of Workers' `ExecutionContext` the Worker uses. */
export interface ExecutionContext {
  waitUntil(promise: Promise<unknown>): void;
}

/** Builds the Worker for a task list (the default export uses `./tasks.ts`). */
export function createCloudflareWorker(tasksFor: TasksFor) {
  return {
    /** The cron trigger: recovery, then a bounded pass. */
    async scheduled(_controller: ScheduledController, env: FunctionsEnv, ctx: ExecutionContext): Promise<void> {
      const inv = openInvocation(env, { platform: 'cloudflare', tasks: tasksFor, budgetCeilingMs: SCHEDULED_BUDGET_MS });
      try {
        await cronPass(inv);
      } finally {
        ctx.waitUntil(inv.close());
      }
    },

    /** `POST /drain`, the signed webhook; `/dashboard` (token-protected); everything else is 404. */
    async fetch(request: Request, env: FunctionsEnv, ctx: ExecutionContext): Promise<Response> {
      const pathname = new URL(request.url).pathname;
      if (pathname === '/dashboard' || pathname.startsWith('/dashboard/')) return dashboard(request, env, ctx, tasksFor);
      if (pathname !== '/drain') return json(404, { error: 'not found' });
      let inv;
      try {
        inv = openInvocation(env, {
          platform: 'cloudflare',
          tasks: tasksFor,
          budgetCeilingMs: DRAIN_BUDGET_MS,
          waitUntil: (work) => ctx.waitUntil(work),
        });
      } catch (err) {
        // A ConfigError names a setting, never its value.
        console.log(JSON.stringify({ outlive: 'drain-misconfigured', error: toError(err).message }));
        return json(500, { error: 'the drain endpoint is not configured' });
      }
      try {
        return await handleDrain(request, inv);
      } finally {
        ctx.waitUntil(inv.close());
      }
    },
  };
}

/** `/dashboard`: the pages over the invocation's pool, behind `OUTLIVE_DASHBOARD_TOKEN`. */
async function dashboard(request: Request, env: FunctionsEnv, ctx: ExecutionContext, tasksFor: TasksFor): Promise<Response> {
  let inv;
  try {
    inv = openInvocation(env, { platform: 'cloudflare', tasks: tasksFor, budgetCeilingMs: DRAIN_BUDGET_MS });
  } catch (err) {
    console.log(JSON.stringify({ outlive: 'dashboard-misconfigured', error: toError(err).message }));
    return json(500, { error: 'the dashboard is not configured' });
  }
  try {
    return await handleDashboard(request, inv.pool, {
      token: typeof env.OUTLIVE_DASHBOARD_TOKEN === 'string' ? env.OUTLIVE_DASHBOARD_TOKEN : undefined,
      basePath: '/dashboard',
      log: (line) => inv.log('dashboard-error', { error: line }),
    });
  } finally {
    ctx.waitUntil(inv.close());
  }
}

export type { FunctionsEnv, TaskDeps, TasksFor, Deployment } from './invocation.js';
