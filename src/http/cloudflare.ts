/**
 * `outlive/cloudflare`: the Worker's handlers. `scheduled` runs the cron
 * tick, `fetch` serves `POST /drain`, `POST /signal` and `/dashboard`. An app's Worker is
 * two lines (an entry module may export nothing but handlers):
 *
 * ```ts
 * import { createCloudflareWorker } from 'outlive/cloudflare';
 * import { tasks } from './tasks.js';
 * export default createCloudflareWorker(tasks);
 * ```
 *
 * That Worker reaches Postgres through Neon's WebSocket driver and needs no
 * `nodejs_compat`. With `nodejs_compat`, pass node-postgres to reach any
 * Postgres, through a Hyperdrive binding named `HYPERDRIVE` where there is
 * one: `createCloudflareWorker(tasks, { pg })` (`import pg from 'pg'`).
 *
 * Each event opens its own pool and closes it through `ctx.waitUntil`: a
 * connection opened for one request cannot serve another on Workers.
 *
 * It needs the Workers Paid plan: the Free plan gives an invocation 10 ms of
 * CPU, and a pass of 1 to 100 no-op tasks measured 9 to 18 ms.
 */
import { isWhole } from '../model/checks.js';
import { ConfigError, toError } from '../model/errors.js';
import { handleDashboard } from './dashboard/index.js';
import { cronPass } from './cron.js';
import { handleDrain } from './drain.js';
import { checkSignalRouteOptions, handleSignal, type SignalRouteOptions } from './signal-route.js';
import { budgetWithin, json, openInvocation, type FunctionsEnv, type Invocation, type TasksFor } from './invocation.js';
import type { PgModule, Runtime } from '../db/connect.js';

// The budgets follow the limits Cloudflare documents for Workers Paid
// (developers.cloudflare.com/workers/platform/limits: "CPU time", "Duration"
// and its wall-time table; the changelog of 2025-03-25 for `cpu_ms`):
// - CPU time: 30 s per invocation by default; `[limits] cpu_ms` sets it, up
//   to 300,000 (5 min), and is taken here as a cap on cron events too (the
//   safe reading). A cron trigger whose schedule interval is under 1 hour
//   may use 30 s of CPU, one of 1 hour or more up to 15 min.
// - Wall time: unlimited for an HTTP request while its client is connected;
//   work passed to `ctx.waitUntil` continues at most 30 s after the response
//   (or the client's disconnect); a cron invocation may last 15 min.
// A pass mostly waits on the database, and its CPU time is never more than
// its wall time, so a wall-time budget under the CPU limit keeps it inside
// both. Each event's limit is the smaller of its CPU and wall-time limits
// (see workerLimitMs); its budget keeps back a tenth, at least 5 s, for the
// last settles and the pool's close (budgetWithin). With cpu_ms at 30 s, as
// wrangler.toml sets it: 25 s for every event. A drain's caller that waits
// (no `Prefer: respond-async`) and a cron an hour or more apart get more
// when cpu_ms is raised (tell the Worker with OUTLIVE_CPU_MS); a drain in
// waitUntil and a cron under an hour apart never do. `OUTLIVE_BUDGET_MS`
// may lower any budget, never raise it.
/** Cloudflare's default CPU limit of an invocation, and the `cpu_ms` wrangler.toml sets (ms). */
export const CPU_MS_DEFAULT = 30_000;
/** The largest `cpu_ms` Cloudflare accepts (ms). */
export const CPU_MS_MAX = 300_000;
/** CPU limit of a cron event under an hour apart (ms). */
export const CRON_CPU_MS = 30_000;
/** CPU limit of a cron event an hour or more apart, and the wall-time limit of any cron event (ms). */
export const LONG_CRON_MS = 15 * 60_000;
/** How long `ctx.waitUntil` work may continue after the response (ms). */
export const WAIT_UNTIL_MS = 30_000;

/** What a Worker invocation runs for, as far as its limits go. */
export type WorkerEvent =
  /** A cron trigger, by the expression that fired. */
  | { trigger: 'cron'; cron: string }
  /** The drain: in `ctx.waitUntil` after a 202, or while its caller waits. */
  | { trigger: 'drain'; background: boolean };

/**
 * Whether a cron expression fires an hour or more apart: only when its
 * minute is one number (every firing is then a whole number of hours after
 * the last). Anything else counts as under an hour, the smaller limit.
 */
export function hourOrMoreApart(cron: string): boolean {
  const fields = cron.trim().split(/\s+/);
  return fields.length === 5 && /^\d{1,2}$/.test(fields[0]!) && Number(fields[0]) <= 59;
}

/** The limit an event's pass must end within (ms), given the Worker's `cpu_ms`. */
export function workerLimitMs(event: WorkerEvent, cpuMs: number = CPU_MS_DEFAULT): number {
  if (event.trigger === 'cron') {
    const cpu = hourOrMoreApart(event.cron) ? Math.min(LONG_CRON_MS, cpuMs) : Math.min(CRON_CPU_MS, cpuMs);
    return Math.min(cpu, LONG_CRON_MS);
  }
  return event.background ? Math.min(cpuMs, WAIT_UNTIL_MS) : cpuMs;
}

/** The budget ceiling of an event's pass (ms): its limit less what is kept back. */
export function workerBudgetMs(event: WorkerEvent, cpuMs?: number): number {
  return budgetWithin(workerLimitMs(event, cpuMs));
}

/** Reads `OUTLIVE_CPU_MS`, the Worker's `cpu_ms`; throws ConfigError naming it (never its value). */
function cpuMsOf(env: FunctionsEnv): number {
  const raw = env.OUTLIVE_CPU_MS;
  if (raw === undefined || raw === '') return CPU_MS_DEFAULT;
  const value = Number(raw);
  if (!isWhole(value, { min: 1, max: CPU_MS_MAX })) {
    throw new ConfigError(
      `outlive: OUTLIVE_CPU_MS must be a whole number from 1 to ${CPU_MS_MAX}, the Worker's [limits] cpu_ms; unset it for ${CPU_MS_DEFAULT}`,
    );
  }
  return value;
}

// Looser than the drain's own reading of the header: a request it may run in
// waitUntil always gets the waitUntil budget.
function mayAnswerAtOnce(request: Request): boolean {
  return /respond-async/i.test(request.headers.get('prefer') ?? '');
}

/** The part of Workers' `ScheduledController` the Worker reads. */
export interface ScheduledController {
  readonly cron: string;
  readonly scheduledTime: number;
}

/** The part of Workers' `ExecutionContext` the Worker uses. */
export interface ExecutionContext {
  waitUntil(promise: Promise<unknown>): void;
}

/** Options of {@link createCloudflareWorker}. */
export interface CloudflareWorkerOptions {
  /**
   * node-postgres (`import pg from 'pg'`), under `nodejs_compat`: the Worker
   * then reaches Postgres through the Hyperdrive binding `HYPERDRIVE` where
   * there is one, else straight to `DATABASE_URL`. Without it, the Worker
   * uses Neon's WebSocket driver on `DATABASE_URL`.
   */
  pg?: PgModule;
  /** `'neon'` keeps Neon's driver even when `pg` is given. */
  driver?: 'pg' | 'neon';
  /** `POST /signal`'s options (src/http/signal-route.ts); `false` answers 404 there. */
  signals?: SignalRouteOptions | false;
}

/** Builds the Worker for a task list (the default export uses `./tasks.ts`). */
export function createCloudflareWorker(tasksFor: TasksFor, options: CloudflareWorkerOptions = {}) {
  const runtime: Runtime = { kind: 'workerd', pg: options.pg, driver: options.driver };
  const signals = options.signals === false ? false : checkSignalRouteOptions(options.signals ?? {}, 'createCloudflareWorker signals');
  return {
    /** The cron trigger: recovery, then a bounded pass. */
    async scheduled(controller: ScheduledController, env: FunctionsEnv, ctx: ExecutionContext): Promise<void> {
      const budgetCeilingMs = workerBudgetMs({ trigger: 'cron', cron: controller.cron }, cpuMsOf(env));
      const inv = openInvocation(env, { platform: 'cloudflare', routedByHost: true, tasks: tasksFor, budgetCeilingMs, runtime });
      try {
        await cronPass(inv);
      } finally {
        ctx.waitUntil(inv.close());
      }
    },

    /** `POST /drain`, the signed webhook; `POST /signal`; `/dashboard` (token-protected); everything else is 404. */
    async fetch(request: Request, env: FunctionsEnv, ctx: ExecutionContext): Promise<Response> {
      const pathname = new URL(request.url).pathname;
      if (pathname === '/dashboard' || pathname.startsWith('/dashboard/')) return dashboard(request, env, ctx, tasksFor, runtime);
      if (signals !== false && (pathname === '/signal' || pathname === '/signal/')) return signalRoute(request, env, ctx, tasksFor, runtime, signals);
      // `/drain/` too: the signature treats the two as one endpoint, as platforms redirect between them.
      if (pathname !== '/drain' && pathname !== '/drain/') return json(404, { error: 'not found' });
      const budget = () => workerBudgetMs({ trigger: 'drain', background: mayAnswerAtOnce(request) }, cpuMsOf(env));
      return serve('drain', env, ctx, tasksFor, runtime, budget, (inv) => handleDrain(request, inv));
    },
  };
}

/** `POST /signal`: its pass runs in `ctx.waitUntil`, on the background drain's budget. */
async function signalRoute(
  request: Request,
  env: FunctionsEnv,
  ctx: ExecutionContext,
  tasksFor: TasksFor,
  runtime: Runtime,
  options: SignalRouteOptions,
): Promise<Response> {
  const budget = () => workerBudgetMs({ trigger: 'drain', background: true }, cpuMsOf(env));
  return serve('signal', env, ctx, tasksFor, runtime, budget, (inv) => handleSignal(request, inv, options));
}

/** One request's invocation: opened (or a 500), handed to `handle`, closed after its background work. */
async function serve(
  what: 'drain' | 'signal',
  env: FunctionsEnv,
  ctx: ExecutionContext,
  tasksFor: TasksFor,
  runtime: Runtime,
  budget: () => number,
  handle: (inv: Invocation) => Promise<Response>,
): Promise<Response> {
  let inv: Invocation;
  try {
    inv = openInvocation(env, { platform: 'cloudflare', routedByHost: true, tasks: tasksFor, budgetCeilingMs: budget(), waitUntil: (work) => ctx.waitUntil(work), runtime });
  } catch (err) {
    // A ConfigError names a setting, never its value.
    console.log(JSON.stringify({ outlive: `${what}-misconfigured`, error: toError(err).message }));
    return json(500, { error: `the ${what} endpoint is not configured` });
  }
  try {
    return await handle(inv);
  } finally {
    ctx.waitUntil(inv.close());
  }
}

/** `/dashboard`: the pages over the invocation's pool, behind `OUTLIVE_DASHBOARD_TOKEN`. */
async function dashboard(request: Request, env: FunctionsEnv, ctx: ExecutionContext, tasksFor: TasksFor, runtime: Runtime): Promise<Response> {
  let inv;
  try {
    // The dashboard runs no pass; its budget is only what an invocation needs.
    inv = openInvocation(env, { platform: 'cloudflare', routedByHost: true, tasks: tasksFor, budgetCeilingMs: workerBudgetMs({ trigger: 'drain', background: false }), runtime });
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
export type { SignalCall, SignalFromCall, SignalRouteOptions, ToSignal } from './signal-route.js';
export type { PgModule, InvocationPool, HyperdriveBinding } from '../db/connect.js';
