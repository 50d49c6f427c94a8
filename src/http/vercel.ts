/**
 * `outlive/vercel`: Vercel routes as Web `Request` to `Response` handlers:
 * the cron route (`GET`, `Authorization: Bearer <CRON_SECRET>`), the drain
 * route (`POST`, signed), the signal route (`createSignalRoute`) and the dashboard. An app's files under `api/` are a
 * line or two each:
 *
 * ```ts
 * // api/drain.ts
 * import { createDrainRoute } from 'outlive/vercel';
 * import { tasks } from '../tasks.js';
 * export const POST = createDrainRoute(tasks);
 * ```
 *
 * On Vercel the drain answers a nudge at once (202) and runs its pass in
 * Vercel's `waitUntil`, as the Worker does in `ctx.waitUntil`. Off Vercel
 * with no `waitUntil` given, the drain answers when its pass is done (200
 * with the report), whatever the `Prefer` header.
 *
 * On the Node.js runtime the routes reach any Postgres through node-postgres,
 * or through Neon's driver when `DATABASE_URL` is Neon's; on the Edge runtime
 * through Neon's driver (`src/db/connect.ts` decides).
 */
import { handleCronRequest } from './cron.js';
import { handleDashboard } from './dashboard/index.js';
import { handleDrain } from './drain.js';
import { checkSignalRouteOptions, handleSignal, type SignalRouteOptions } from './signal-route.js';
import { budgetWithin, json, openInvocation, type FunctionsEnv, type Invocation, type TasksFor } from './invocation.js';
import { toError } from '../model/errors.js';
import type { DriverName, PgModule, Runtime } from '../db/connect.js';

// The budget follows the limits Vercel documents (vercel.com/docs/functions/
// limitations and /configuring-functions/duration; the reference of
// @vercel/functions for waitUntil and getDeadline):
// - a function runs at most its maxDuration, set per route in vercel.json:
//   300 s by default, at most 300 s on Hobby and 800 s on Pro and Enterprise;
// - work passed to waitUntil shares it: it ends at the invocation's deadline,
//   as the response does, so a drain in waitUntil gets no less and no more.
// When Vercel gives the invocation's deadline (what getDeadline reads), the
// pass ends a tenth before it, at least 5 s (budgetWithin); that follows the
// route's real maxDuration and the time a cold start already took. Else the
// route assumes `maxDuration` (its option, default 60 s as vercel.json sets
// it) less 10 s for a cold start: 45 s. `OUTLIVE_BUDGET_MS` may lower it,
// never raise it.
/** The `maxDuration` (s) vercel.json gives the routes; a route assumes it unless told otherwise. */
export const VERCEL_MAX_DURATION_S = 60;
/** What a cold start may take of maxDuration before a route runs, when Vercel does not give the deadline (ms). */
export const COLD_START_MS = 10_000;

/**
 * The budget ceiling of a pass on Vercel (ms): until the invocation's
 * `deadline` when Vercel gives it, else within `maxDurationS` less a cold
 * start; less what {@link budgetWithin} keeps back.
 */
export function vercelBudgetMs(maxDurationS: number, deadline?: Date, now: number = Date.now()): number {
  const limitMs = deadline ? deadline.getTime() - now : maxDurationS * 1_000 - COLD_START_MS;
  return budgetWithin(limitMs);
}

/** What Vercel's runtime gives each invocation, where `@vercel/functions` reads it. */
interface RequestContext {
  waitUntil?: unknown;
  /** The invocation's deadline, shared by the response and its waitUntil work (an ISO date). */
  deadline?: unknown;
}

/**
 * The request context Vercel's runtime keeps for the invocation in flight:
 * the global `@vercel/functions` reads its `waitUntil` and `getDeadline`
 * from. Read here without that package (its dependencies would reach every
 * app that installs outlive, Workers included), and without an import a
 * bundler must resolve.
 */
function requestContext(): RequestContext | undefined {
  const holder = (globalThis as Record<symbol, unknown>)[Symbol.for('@vercel/request-context')] as { get?: () => unknown } | undefined;
  const context = typeof holder?.get === 'function' ? holder.get() : undefined;
  return context !== null && typeof context === 'object' ? (context as RequestContext) : undefined;
}

/** What a route uses of Vercel's runtime, or null where it has none. */
function vercelRuntime(): { waitUntil: (work: Promise<unknown>) => void; deadline: Date | undefined } | null {
  const context = requestContext();
  if (typeof context?.waitUntil !== 'function') return null;
  const waitUntil = context.waitUntil as (work: Promise<unknown>) => void;
  const deadline = typeof context.deadline === 'string' || typeof context.deadline === 'number' ? new Date(context.deadline) : undefined;
  return { waitUntil: (work) => waitUntil.call(context, work), deadline: deadline && !Number.isNaN(deadline.getTime()) ? deadline : undefined };
}

let warned = false;

declare const EdgeRuntime: string | undefined;

/** True on Vercel's Edge runtime (and Next.js middleware), which has no TCP sockets. */
function onEdge(): boolean {
  return typeof EdgeRuntime === 'string';
}

let pgModule: Promise<PgModule> | undefined;

/** node-postgres, loaded once on the Node.js runtime. */
function loadPg(): Promise<PgModule> {
  pgModule ??= import('pg').then((m) => ((m as { default?: PgModule }).default ?? (m as unknown as PgModule)));
  return pgModule;
}

async function webSocketClass(): Promise<unknown> {
  // Node 22+ (Vercel's default) has a global WebSocket; older Node needs `ws`.
  if (typeof globalThis.WebSocket === 'function') return undefined;
  const ws = await import('ws');
  return ws.WebSocket;
}

/** Where a route reads its settings, what it may assume of Vercel, and where it writes its log. */
export interface RouteOptions {
  /** Default `process.env`, read at each request. */
  env?: FunctionsEnv;
  /** Default `console.log`. */
  write?: (line: string) => void;
  /**
   * The driver: `'pg'` (node-postgres, any Postgres) or `'neon'` (Neon's
   * WebSocket driver). Default: node-postgres on the Node.js runtime unless
   * `DATABASE_URL` is Neon's; Neon's driver on the Edge runtime.
   */
  driver?: DriverName;
  /**
   * The route's `maxDuration` in vercel.json (s), assumed when Vercel does
   * not give the invocation's deadline. Default {@link VERCEL_MAX_DURATION_S};
   * lower than the real one is safe, higher is not.
   */
  maxDuration?: number;
  /**
   * Continues work after the response. Default on Vercel (`VERCEL=1`):
   * Vercel's own `waitUntil` (the one `@vercel/functions` exports);
   * elsewhere none, and the drain answers when its pass is done. Give one to
   * run the routes on another host that has it (Next.js: `after` from
   * `next/server`).
   */
  waitUntil?: (work: Promise<unknown>) => void;
}

/** An open invocation and where its leftover work goes. */
interface Opened {
  inv: Invocation;
  /** Takes the pool's close (after any background pass) past the response; null: close before answering. */
  waitUntil: ((work: Promise<unknown>) => void) | null;
}

async function open(tasksFor: TasksFor, options: RouteOptions, { background }: { background: boolean }): Promise<Opened | Response> {
  const write = options.write ?? ((line: string) => console.log(line));
  const env = options.env ?? (process.env as FunctionsEnv);
  const onVercel = env.VERCEL === '1';
  const vercel = onVercel ? vercelRuntime() : null;
  if (onVercel && !vercel && !warned) {
    warned = true;
    write(JSON.stringify({ outlive: 'vercel-context-missing', platform: 'vercel', error: "VERCEL=1 but Vercel's request context has no waitUntil: the drain answers when its pass is done" }));
  }
  const waitUntil = options.waitUntil ?? vercel?.waitUntil ?? null;
  try {
    const edge = onEdge();
    const runtime: Runtime = { kind: edge ? 'edge' : 'node', driver: options.driver, pg: edge || options.driver === 'neon' ? undefined : await loadPg() };
    const inv = openInvocation(env, {
      platform: 'vercel',
      tasks: tasksFor,
      budgetCeilingMs: vercelBudgetMs(options.maxDuration ?? VERCEL_MAX_DURATION_S, vercel?.deadline),
      runtime,
      // Vercel routes by host; a self-hosted server's request URL is the client's Host header.
      routedByHost: onVercel,
      webSocketConstructor: await webSocketClass(),
      write,
      ...(background && waitUntil ? { waitUntil } : {}),
    });
    return { inv, waitUntil: background ? waitUntil : null };
  } catch (err) {
    // A ConfigError names a setting, never its value.
    write(JSON.stringify({ outlive: 'misconfigured', platform: 'vercel', error: toError(err).message }));
    return json(500, { error: 'the endpoint is not configured' });
  }
}

/** Closes the invocation: after the response when its work may outlive it, else before. */
async function close({ inv, waitUntil }: Opened): Promise<void> {
  if (waitUntil) waitUntil(inv.close());
  else await inv.close();
}

/** Builds the cron route's `GET` handler for a task list. */
export function createCronRoute(tasksFor: TasksFor, options: RouteOptions = {}) {
  return async function GET(request: Request): Promise<Response> {
    const opened = await open(tasksFor, options, { background: false });
    if (opened instanceof Response) return opened;
    try {
      return await handleCronRequest(request, opened.inv);
    } finally {
      await close(opened);
    }
  };
}

/** Builds the drain route's `POST` handler for a task list. */
export function createDrainRoute(tasksFor: TasksFor, options: RouteOptions = {}) {
  return async function POST(request: Request): Promise<Response> {
    const opened = await open(tasksFor, options, { background: true });
    if (opened instanceof Response) return opened;
    try {
      return await handleDrain(request, opened.inv);
    } finally {
      await close(opened);
    }
  };
}

/**
 * Builds the signal route's `POST` handler (src/http/signal-route.ts) for a task list.
 *
 * ```ts
 * // api/signal.ts
 * export const POST = createSignalRoute(tasks, {
 *   toSignal: ({ body }) => {
 *     const event = body as { type: string; data: { id: string } };
 *     return event.type === 'response.completed' ? { key: `openai:${event.data.id}`, payload: event.data } : null;
 *   },
 * });
 * ```
 */
export function createSignalRoute(tasksFor: TasksFor, options: SignalRouteOptions & RouteOptions = {}) {
  const { secrets, toSignal, ...routeOptions } = options;
  const signalOptions = checkSignalRouteOptions({ ...(secrets ? { secrets } : {}), ...(toSignal ? { toSignal } : {}) }, 'createSignalRoute');
  return async function POST(request: Request): Promise<Response> {
    const opened = await open(tasksFor, routeOptions, { background: true });
    if (opened instanceof Response) return opened;
    try {
      return await handleSignal(request, opened.inv, signalOptions);
    } finally {
      await close(opened);
    }
  };
}

/** Where the dashboard is mounted on Vercel. */
export const VERCEL_DASHBOARD_PATH = '/api/dashboard';

/** Builds the dashboard's handler (export it as both `GET` and `POST`), behind `OUTLIVE_DASHBOARD_TOKEN`. */
export function createDashboardRoute(tasksFor: TasksFor, options: RouteOptions & { basePath?: string } = {}) {
  return async function dashboard(request: Request): Promise<Response> {
    const env = options.env ?? (process.env as FunctionsEnv);
    const opened = await open(tasksFor, { ...options, env }, { background: false });
    if (opened instanceof Response) return opened;
    const { inv } = opened;
    try {
      return await handleDashboard(request, inv.pool, {
        token: typeof env.OUTLIVE_DASHBOARD_TOKEN === 'string' ? env.OUTLIVE_DASHBOARD_TOKEN : undefined,
        basePath: options.basePath ?? VERCEL_DASHBOARD_PATH,
        log: (line) => inv.log('dashboard-error', { error: line }),
      });
    } finally {
      await close(opened);
    }
  };
}

export type { FunctionsEnv, TaskDeps, TasksFor, Deployment } from './invocation.js';
export type { SignalCall, SignalFromCall, SignalRouteOptions, ToSignal } from './signal-route.js';
export type { DriverName, InvocationPool } from '../db/connect.js';
