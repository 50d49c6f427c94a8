/**
 * Vercel's dashboard route: `GET /api/dashboard` (and its pages below it),
 * `POST` for its actions, behind `OUTLIVE_DASHBOARD_TOKEN`. Route every
 * `/api/dashboard/*` path to this function (see docs/operations.md).
 */
import { handleDashboard } from '../../src/dashboard/index.js';
import { toError } from '../../src/errors.js';
import { json, openInvocation, type FunctionsEnv, type TasksFor } from '../invocation.js';
import { tasks } from '../tasks.js';
import { VERCEL_BUDGET_MS, type RouteOptions } from './routes.js';

/** Where the dashboard is mounted on Vercel. */
export const VERCEL_DASHBOARD_PATH = '/api/dashboard';

/** Builds the dashboard's handler (for both `GET` and `POST`). */
export function createDashboardRoute(tasksFor: TasksFor, options: RouteOptions = {}) {
  const write = options.write ?? ((line: string) => console.log(line));
  return async function dashboard(request: Request): Promise<Response> {
    const env = options.env ?? (process.env as FunctionsEnv);
    let inv;
    try {
      inv = openInvocation(env, {
        platform: 'vercel',
        tasks: tasksFor,
        budgetCeilingMs: VERCEL_BUDGET_MS,
        // Node 22+ (Vercel's default) has a global WebSocket; older Node needs `ws`.
        webSocketConstructor: typeof globalThis.WebSocket === 'function' ? undefined : (await import('ws')).WebSocket,
        write,
      });
    } catch (err) {
      // A ConfigError names a setting, never its value.
      write(JSON.stringify({ outlive: 'misconfigured', platform: 'vercel', error: toError(err).message }));
      return json(500, { error: 'the dashboard is not configured' });
    }
    try {
      return await handleDashboard(request, inv.pool, {
        token: typeof env.OUTLIVE_DASHBOARD_TOKEN === 'string' ? env.OUTLIVE_DASHBOARD_TOKEN : undefined,
        basePath: VERCEL_DASHBOARD_PATH,
        log: (line) => inv.log('dashboard-error', { error: line }),
      });
    } finally {
      await inv.close();
    }
  };
}

const route = createDashboardRoute(tasks);
/** The dashboard's pages. */
export const GET = route;
/** The dashboard's actions (retry, cancel). */
export const POST = route;
