/**
 * `outlive/vercel`: Vercel routes as Web `Request` to `Response` handlers:
 * the cron route (`GET`, `Authorization: Bearer <CRON_SECRET>`), the drain
 * route (`POST`, signed) and the dashboard. An app's files under `api/` are a
 * line or two each:
 *
 * ```ts
 * // api/drain.ts
 * import { createDrainRoute } from 'outlive/vercel';
 * import { tasks } from '../tasks.js';
 * export const POST = createDrainRoute(tasks);
 * ```
 *
 * A Vercel function has no `waitUntil` here, so the drain always answers
 * when its pass is done (200 with the report), whatever the `Prefer` header.
 */
import { handleCronRequest } from './cron.js';
import { handleDashboard } from './dashboard/index.js';
import { handleDrain } from './drain.js';
import { json, openInvocation, type FunctionsEnv, type Invocation, type TasksFor } from './invocation.js';
import { toError } from '../model/errors.js';

// The pass's budget ceiling on Vercel (ms): `maxDuration` is 60 s for the
// routes in vercel.json; 45 s leaves 15 s for recovery, the last settles, the
// pool's close and a cold start. Raise both together.
/** The budget ceiling of a pass on Vercel (ms). */
export const VERCEL_BUDGET_MS = 45_000;

async function webSocketClass(): Promise<unknown> {
  // Node 22+ (Vercel's default) has a global WebSocket; older Node needs `ws`.
  if (typeof globalThis.WebSocket === 'function') return undefined;
  const ws = await import('ws');
  return ws.WebSocket;
}

/** Where a route reads its settings and writes its log. */
export interface RouteOptions {
  /** Default `process.env`, read at each request. */
  env?: FunctionsEnv;
  /** Default `console.log`. */
  write?: (line: string) => void;
}

async function open(tasksFor: TasksFor, options: RouteOptions): Promise<Invocation | Response> {
  const write = options.write ?? ((line: string) => console.log(line));
  try {
    return openInvocation(options.env ?? (process.env as FunctionsEnv), {
      platform: 'vercel',
      tasks: tasksFor,
      budgetCeilingMs: VERCEL_BUDGET_MS,
      webSocketConstructor: await webSocketClass(),
      write,
    });
  } catch (err) {
    // A ConfigError names a setting, never its value.
    write(JSON.stringify({ outlive: 'misconfigured', platform: 'vercel', error: toError(err).message }));
    return json(500, { error: 'the endpoint is not configured' });
  }
}

/** Builds the cron route's `GET` handler for a task list. */
export function createCronRoute(tasksFor: TasksFor, options: RouteOptions = {}) {
  return async function GET(request: Request): Promise<Response> {
    const inv = await open(tasksFor, options);
    if (inv instanceof Response) return inv;
    try {
      return await handleCronRequest(request, inv);
    } finally {
      await inv.close();
    }
  };
}

/** Builds the drain route's `POST` handler for a task list. */
export function createDrainRoute(tasksFor: TasksFor, options: RouteOptions = {}) {
  return async function POST(request: Request): Promise<Response> {
    const inv = await open(tasksFor, options);
    if (inv instanceof Response) return inv;
    try {
      return await handleDrain(request, inv);
    } finally {
      await inv.close();
    }
  };
}

/** Where the dashboard is mounted on Vercel. */
export const VERCEL_DASHBOARD_PATH = '/api/dashboard';

/** Builds the dashboard's handler (export it as both `GET` and `POST`), behind `OUTLIVE_DASHBOARD_TOKEN`. */
export function createDashboardRoute(tasksFor: TasksFor, options: RouteOptions & { basePath?: string } = {}) {
  return async function dashboard(request: Request): Promise<Response> {
    const env = options.env ?? (process.env as FunctionsEnv);
    const inv = await open(tasksFor, { ...options, env });
    if (inv instanceof Response) return inv;
    try {
      return await handleDashboard(request, inv.pool, {
        token: typeof env.OUTLIVE_DASHBOARD_TOKEN === 'string' ? env.OUTLIVE_DASHBOARD_TOKEN : undefined,
        basePath: options.basePath ?? VERCEL_DASHBOARD_PATH,
        log: (line) => inv.log('dashboard-error', { error: line }),
      });
    } finally {
      await inv.close();
    }
  };
}

export type { FunctionsEnv, TaskDeps, TasksFor, Deployment } from './invocation.js';

