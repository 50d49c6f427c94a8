/**
 * The dashboard as one Web handler, `Request` in and `Response` out, so the
 * Cloudflare Worker, the Vercel functions and the local stack serve the same
 * pages: `handleDashboard(request, db, { token, basePath })`.
 *
 * Routes under `basePath`: `/` the overview, `/runs/:id` (`?step=` searches
 * its steps, `?after=` pages them), `/tasks/:id`, `/tasks` and `/runs`
 * (lists by keyset: `?before=`, filters `state`, `name`, `queue`, `key`,
 * `from`, `to`, `q` for error text), `/queues`, `/limits`, `/bulk?action=retry|cancel&…`
 * (the count, and a button to `POST /bulk`), and the actions
 * `POST /tasks/:id/retry`, `POST /runs/:id/retry`,
 * `POST /runs/:id/cancel`, `POST /limits/pause` and `/limits/resume` (form
 * field `key`; `for` in ms and `reason` to pause), `POST /queues/pause` and
 * `/queues/resume` (`queue`; `reason` to pause). Without the token every
 * route answers 401 and shows nothing. `/metrics` serves Prometheus text
 * (`./metrics.ts`) behind the same token.
 */
import { checkWhole, MIN_SECRET_LENGTHS, parseId } from '../../model/checks.js';
import { cancelRun } from '../../admin/cancel.js';
import { toError } from '../../model/errors.js';
import { toPool, type Database } from '../../db/executor.js';
import { explainRun, explainSteps } from '../../admin/explain.js';
import { runGroups, runTimeline, runVersion } from '../../admin/run-view.js';
import { secretsEqual } from '../nudge.js';
import { retryRun, retryTask } from '../../admin/retry.js';
import { FlowControlError, pauseKey, pauseQueue, resumeKey, resumeQueue } from '../../admin/flow.js';
import { credentialOf, csrfValue, DEFAULT_SESSION_SECONDS, sameSiteForm, sessionCookie } from './auth.js';
import { metricsResponse } from './metrics.js';
import { limitsPage, messagePage, overviewPage, taskPage, type PageContext } from './pages.js';
import { GRAPH_MAX_TASKS, runPage } from './run-page.js';
import { bulkPage, queryParams, queuesPage, runsPage, taskQueryOf, tasksPage } from './list-pages.js';
import { browseTasks, LIST_WINDOW } from '../../admin/browse.js';
import { BULK_MAX, countBulk, runBulk } from '../../admin/bulk.js';
import { RUN_STATES, type RunState } from '../../model/states.js';
import { layoutRun } from './graph.js';
import { COUNT_CAP, finishedByQueue, finishedPerMinute, getTask, listFailures, listKeys, listRuns, listSchedules, parkedWaits, pausedQueues, queueDepths, runEdges, status, waitedKeys } from '../../admin/queries.js';

/** How the dashboard is mounted and protected. */
export interface DashboardOptions {
  /** The token a visitor must present (`OUTLIVE_DASHBOARD_TOKEN`). Without one the dashboard is off: 401 for all. */
  token: string | undefined;
  /** Where the dashboard lives, e.g. `/dashboard` (no trailing slash). Default `/dashboard`. */
  basePath?: string;
  /**
   * Seconds between the pages' automatic refreshes; 0 turns it off. Default 5.
   * A page whose reads took longer than a twentieth of it refreshes at
   * double, quadruple … the interval ({@link pacedRefresh}), and says so.
   */
  refreshSeconds?: number;
  /**
   * Where to report an error the page hides: its message, plain text (the
   * platforms write it into their own JSON log line). Default: a JSON line
   * on `console.error`. Never given a secret.
   */
  log?: (message: string) => void;
  /**
   * How long a browser session lasts, in seconds: the cookie's Max-Age, and
   * the age past which the server refuses it whatever the browser kept.
   * Default 43,200 (12 hours).
   */
  sessionSeconds?: number;
}

/** Shortest token the dashboard accepts: a guessable token is no protection. */
export const MIN_TOKEN_LENGTH = MIN_SECRET_LENGTHS.dashboard;

const SECURITY_HEADERS: Record<string, string> = {
  'content-type': 'text/html; charset=utf-8',
  'cache-control': 'no-store',
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'same-origin',
  'content-security-policy': "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
};

function page(status: number, body: string, headers: Record<string, string> = {}): Response {
  return new Response(body, { status, headers: { ...SECURITY_HEADERS, ...headers } });
}

/**
 * A redirect to a path of this site. A path that starts with two slashes (or
 * a slash and a backslash) would be read by a browser as another host
 * (`//evil.example/`), so leading slashes are collapsed into one.
 */
function redirect(path: string, headers: Record<string, string> = {}): Response {
  const location = path.replace(/^[/\\]+/, '/');
  return new Response(null, { status: 303, headers: { location, 'cache-control': 'no-store', ...headers } });
}

const FLASH: Record<string, string> = {
  'task-retried': 'Retried: the task is pending again and runs at the next pass.',
  'run-retried': 'Retried: the run is running again; its unsuccessful tasks are pending.',
  'run-cancelled': 'Cancelled: the run\'s pending and running tasks are cancelled.',
  'not-retried': 'Nothing was retried: it is not failed or cancelled (any more).',
  'not-cancelled': 'Nothing was cancelled: the run had already finished.',
  'key-paused': 'Paused: no task of the key starts until it is resumed or its pause ends. Running tasks run on.',
  'key-resumed': 'Resumed: the key\'s waiting tasks start at the next pass, as its limits allow.',
  'key-not-resumed': 'Nothing was resumed: there is no such key.',
  'queue-paused': 'Paused: no pass claims the queue\'s tasks until it is resumed. Running tasks run on.',
  'queue-resumed': 'Resumed: the queue\'s tasks are claimed again.',
  'queue-not-paused': 'Nothing was resumed: the queue is not paused.',
};

/** The flash after a bulk action: what it changed, from the redirect's numbers. */
function bulkFlash(params: URLSearchParams): string | null {
  const action = params.get('flash');
  const n = (k: string) => (/^[0-9]{1,9}$/.test(params.get(k) ?? '') ? Number(params.get(k)) : 0);
  if (action === 'bulk-retry') return `Retried ${n('changed')} tasks${n('runs') ? ` and ${n('runs')} runs` : ''}${n('skipped') ? `; ${n('skipped')} had changed and were left as they were` : ''}.`;
  if (action === 'bulk-cancel') return `Cancelled ${n('changed')} tasks${n('skipped') ? `; ${n('skipped')} had finished and were left as they were` : ''}.`;
  return null;
}

/** Keys the limits page shows at most (those paused, waiting or running first). */
const MAX_KEYS_SHOWN = 200;
/** The longest pause the dashboard's form may ask for, in ms: 30 days. */
const MAX_PAUSE_MS = 30 * 86_400_000;

// Any digits: parseId says whether a row can have them (beyond a bigint, none can: 404).
const ID = '([0-9]{1,100})';

/**
 * Serves the dashboard for one request. Answers 404 for paths outside
 * `basePath`, so a caller may try it first and fall through.
 */
export async function handleDashboard(request: Request, db: Database, options: DashboardOptions): Promise<Response> {
  const basePath = (options.basePath ?? '/dashboard').replace(/\/+$/, '');
  const url = new URL(request.url);
  if (url.pathname !== basePath && !url.pathname.startsWith(basePath + '/')) {
    return page(404, messagePage('Not found', 'There is nothing here.'));
  }
  const path = url.pathname.slice(basePath.length) || '/';
  const token = options.token ?? '';
  const sessionSeconds = checkWhole('dashboard option sessionSeconds', options.sessionSeconds ?? DEFAULT_SESSION_SECONDS, { min: 60, max: 31_536_000 });
  if (token.length < MIN_TOKEN_LENGTH) {
    return page(401, messagePage('Dashboard disabled', `Set OUTLIVE_DASHBOARD_TOKEN (at least ${MIN_TOKEN_LENGTH} characters) to turn the dashboard on.`));
  }

  // `?token=` once: trade it for the session cookie, and drop it from the address bar.
  const presented = url.searchParams.get('token');
  if (presented !== null && request.method === 'GET') {
    if (!secretsEqual(presented, token)) return page(401, messagePage('Unauthorized', 'That token is not the dashboard\'s token.'));
    url.searchParams.delete('token');
    return redirect(url.pathname + url.search, { 'set-cookie': await sessionCookie(request, token, basePath, sessionSeconds) });
  }

  const credential = await credentialOf(request, token, sessionSeconds);
  if (credential === null) {
    return page(401, messagePage('Unauthorized', 'Open the dashboard with ?token=… or send Authorization: Bearer ….'), {
      'www-authenticate': 'Bearer realm="outlive dashboard"',
    });
  }

  const log = options.log ?? ((message: string) => console.error(JSON.stringify({ outlive: 'dashboard-error', error: message })));
  try {
    if (request.method === 'POST') return await act(request, db, path, basePath, token, credential);
    if (request.method !== 'GET' && request.method !== 'HEAD') return page(405, messagePage('Method not allowed', 'Use GET or POST.'), { allow: 'GET, HEAD, POST' });
    if (path === '/metrics') return await metricsResponse(db);
    const ctx: PageContext = {
      basePath,
      csrf: await csrfValue(token),
      refreshSeconds: url.searchParams.get('refresh') === '0' ? 0 : (options.refreshSeconds ?? 5),
      now: new Date(),
      flash: FLASH[url.searchParams.get('flash') ?? ''] ?? bulkFlash(url.searchParams),
    };
    READS_FROM.set(ctx, Date.now());
    if (path === '/') {
      const [s, throughput, runs, failures, schedules] = await Promise.all([
        status(db, { cap: COUNT_CAP }), finishedPerMinute(db, 60), listRuns(db, { limit: 20, cap: COUNT_CAP }), listFailures(db, 20), listSchedules(db),
      ]);
      ctx.now = s.now;
      const data = { status: s, throughput, runs, failures, schedules };
      // The oldest ready task by when it became due (to the second), not its age: an age changes with every request.
      const due = s.oldestReadyMs === null ? null : Math.round((s.now.getTime() - s.oldestReadyMs) / 1000);
      return fresh(request, ctx, { ...data, status: { ...s, now: undefined, oldestReadyMs: due } }, () => overviewPage(ctx, data));
    }
    let m = new RegExp(`^/runs/${ID}$`).exec(path);
    if (m) return await runRoute(request, db, ctx, m[1]!, url.searchParams);
    m = new RegExp(`^/tasks/${ID}$`).exec(path);
    if (m) {
      const task = await getTask(db, m[1]!); // null for an id beyond a bigint, as for one with no row
      if (!task) return page(404, messagePage('Not found', `There is no task ${m[1]}.`));
      pace(ctx);
      return page(200, taskPage(ctx, task));
    }
    if (path === '/tasks' || path === '/runs' || path === '/queues' || path === '/bulk') return await listRoute(request, db, ctx, path, url.searchParams);
    if (path === '/limits') {
      const [{ keys, total }, queues] = await Promise.all([listKeys(db, { limit: MAX_KEYS_SHOWN }), pausedQueues(db)]);
      pace(ctx);
      return page(200, limitsPage(ctx, { keys, total, queues }));
    }
    return page(404, messagePage('Not found', 'There is nothing here.'));
  } catch (err) {
    // The message may name the database's host; log it, show only that it failed.
    log(toError(err).message.split('\n')[0]!);
    return page(500, messagePage('The database did not answer', 'The dashboard could not read the rows; see the function\'s log.'));
  }
}

/** When each page's reads began: what {@link pace} measures. */
const READS_FROM = new WeakMap<PageContext, number>();

/**
 * The refresh of a page whose reads took `readMs`: the configured interval,
 * doubled until the reads take at most a twentieth of it, so an open page
 * keeps the database busy at most 5 % of the time however large the run or
 * table it shows.
 */
export function pacedRefresh(seconds: number, readMs: number): number {
  let s = seconds;
  while (s > 0 && s < 3_600 && readMs * 20 > s * 1_000) s *= 2;
  return Math.min(s, 3_600);
}

function pace(ctx: PageContext): void {
  const from = READS_FROM.get(ctx);
  if (from !== undefined) ctx.refreshSeconds = pacedRefresh(ctx.refreshSeconds, Date.now() - from);
}

/**
 * Answers a page whose content follows from `data` and the page's context:
 * 304 when the browser holds that page already (its ETag, a hash of both;
 * the CSRF value in it, so a page whose forms would be refused is never
 * kept), so an auto-refresh of an unchanged page sends no body and renders nothing.
 */
async function fresh(request: Request, ctx: PageContext, data: unknown, render: () => string | Promise<string>): Promise<Response> {
  // The configured interval, not the paced one: reads that took more or less
  // time make no other page, so a browser keeps the one it holds, with the
  // interval it came with (a weak ETag: equivalent, not identical, bodies).
  const shown = { data, csrf: ctx.csrf, flash: ctx.flash, refresh: ctx.refreshSeconds };
  pace(ctx);
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(JSON.stringify(shown)));
  const etag = `W/"${[...new Uint8Array(digest, 0, 12)].map((b) => b.toString(16).padStart(2, '0')).join('')}"`;
  // Kept by the browser but asked about each time; private: never by a shared cache.
  const headers = { etag, 'cache-control': 'private, no-cache' };
  const held = request.headers.get('if-none-match');
  if (held !== null && held.split(',').some((t) => t.trim() === etag)) {
    return new Response(null, { status: 304, headers: { ...SECURITY_HEADERS, ...headers } });
  }
  return page(200, await render(), headers);
}

/** Steps a run page lists at once. */
const STEPS_PER_PAGE = 100;

async function runRoute(request: Request, db: Database, ctx: PageContext, raw: string, params: URLSearchParams): Promise<Response> {
  const id = parseId('run', raw);
  if (id === null) return page(404, messagePage('Not found', `There is no run ${raw}.`));
  const search = { prefix: (params.get('step') ?? '').slice(0, 500), after: (params.get('after') ?? '').slice(0, 500) };
  const version = await runVersion(db, id);
  if (!version) return page(404, messagePage('Not found', `There is no run ${id}.`));
  const render = async () => {
    const [run, timeline, steps] = await Promise.all([
      runGroups(db, id),
      runTimeline(db, id),
      explainSteps(db, id, { after: search.after, prefix: search.prefix, limit: STEPS_PER_PAGE }),
    ]);
    if (!run) return null;
    ctx.now = run.now;
    let graph = null;
    if (run.total <= GRAPH_MAX_TASKS) {
      const [all, edges] = await Promise.all([explainRun(db, id, { now: run.now }), runEdges(db, id)]);
      if (all) graph = layoutRun(all.tasks, edges);
    }
    return { data: { run: { ...run, now: undefined }, timeline, steps, search, graph }, body: () => runPage(ctx, { run, timeline, steps, search, graph }) };
  };
  // A finished run's rows change only with its row (a retry reopens it), so its
  // page is known by that row, before the aggregates over its steps are read.
  if (version.state !== 'running') {
    return fresh(request, ctx, { id, version, search }, async () => (await render())?.body() ?? messagePage('Not found', `There is no run ${id}.`));
  }
  const r = await render();
  if (!r) return page(404, messagePage('Not found', `There is no run ${id}.`));
  return fresh(request, ctx, r.data, r.body);
}

/** Tasks and runs a list page shows at once. */
const LIST_PAGE = 50;

function badRequest(message: string): Response {
  return page(400, messagePage('Bad request', message));
}

async function listRoute(request: Request, db: Database, ctx: PageContext, path: string, params: URLSearchParams): Promise<Response> {
  const before = params.get('before') ?? '';
  if (before !== '' && !new RegExp(`^${ID}$`).test(before)) return badRequest('before is the id of a task or run');
  if (path === '/runs') {
    const state = params.get('state') || undefined;
    if (state !== undefined && !(RUN_STATES as readonly string[]).includes(state)) return badRequest(`state must be one of ${RUN_STATES.join(', ')}`);
    const filter = { state: state as RunState | undefined, name: params.get('name')?.trim().slice(0, 500) || undefined };
    const runs = await listRuns(db, { ...filter, before: before || null, limit: LIST_PAGE + 1, cap: COUNT_CAP });
    const next = runs.length > LIST_PAGE ? runs[LIST_PAGE - 1]!.id : null;
    runs.length = Math.min(runs.length, LIST_PAGE);
    return fresh(request, ctx, { runs, next, filter, before }, () => runsPage(ctx, filter, runs, next, before || null));
  }
  if (path === '/queues') {
    const [depths, finished, paused, waits, keys] = await Promise.all([
      queueDepths(db), finishedByQueue(db), pausedQueues(db), parkedWaits(db), waitedKeys(db, { limit: 50 }),
    ]);
    const data = { depths, finished, paused, waits, keys };
    return fresh(request, ctx, data, () => queuesPage(ctx, data));
  }
  const query = taskQueryOf(params);
  if (typeof query === 'string') return badRequest(query);
  if (path === '/bulk') {
    const action = params.get('action');
    if (action !== 'retry' && action !== 'cancel') return badRequest('action is retry or cancel');
    return page(200, bulkPage(ctx, action, query, await countBulk(db, action, query), BULK_MAX));
  }
  const found = await browseTasks(db, query, { before: before || null, limit: LIST_PAGE });
  const data = { ...found, before: before || null, window: LIST_WINDOW };
  return fresh(request, ctx, { data, query }, () => tasksPage(ctx, query, data));
}

async function act(request: Request, db: Database, path: string, basePath: string, token: string, credential: 'bearer' | 'cookie'): Promise<Response> {
  const form = new URLSearchParams(await request.text());
  // A browser's session cookie travels on cross-site requests' navigations only
  // under SameSite=Lax; it is Strict here, and the form must still prove it
  // came from one of our pages. A bearer token is never sent by a browser on its own.
  if (credential === 'cookie' && !(await sameSiteForm(request, token, form))) {
    return page(403, messagePage('Forbidden', 'This action did not come from a dashboard page; reload the page and try again.'));
  }
  let m = new RegExp(`^/tasks/${ID}/retry$`).exec(path);
  if (m) {
    const r = await retryTask(db, m[1]!);
    if (r.state === null) return page(404, messagePage('Not found', `There is no task ${m[1]}.`));
    return redirect(`${basePath}/tasks/${m[1]}?flash=${r.retried ? 'task-retried' : 'not-retried'}`);
  }
  m = new RegExp(`^/runs/${ID}/(retry|cancel)$`).exec(path);
  if (m) {
    if (m[2] === 'retry') {
      const r = await retryRun(db, m[1]!);
      if (r.state === null) return page(404, messagePage('Not found', `There is no run ${m[1]}.`));
      return redirect(`${basePath}/runs/${m[1]}?flash=${r.retried ? 'run-retried' : 'not-retried'}`);
    }
    const r = await cancelRun(db, m[1]!, { reason: 'cancelled from the dashboard' });
    if (r.state === null) return page(404, messagePage('Not found', `There is no run ${m[1]}.`));
    return redirect(`${basePath}/runs/${m[1]}?flash=${r.cancelled ? 'run-cancelled' : 'not-cancelled'}`);
  }
  if (path === '/bulk') {
    const action = form.get('action');
    const query = taskQueryOf(form);
    if ((action !== 'retry' && action !== 'cancel') || typeof query === 'string') return badRequest(typeof query === 'string' ? query : 'action is retry or cancel');
    const r = await runBulk(db, action, query);
    const done = new URLSearchParams([...queryParams(query), ['flash', `bulk-${action}`], ['changed', String(r.changed)], ['runs', String(r.runs)], ['skipped', String(r.skipped)], ['refresh', '0']]);
    return redirect(`${basePath}/tasks?${done}`);
  }
  if (/^\/(limits|queues)\/(pause|resume)$/.test(path)) {
    try {
      return redirect(`${basePath}/limits?flash=${await flowAction(db, path, form)}`);
    } catch (err) {
      if (err instanceof FlowControlError) return page(400, messagePage('Bad request', err.message.replace(/^outlive: /, '')));
      throw err;
    }
  }
  return page(404, messagePage('Not found', 'There is no such action.'));
}

/** Pauses or resumes a key or a queue from a form; returns the flash to show. */
async function flowAction(database: Database, path: string, form: URLSearchParams): Promise<string> {
  const db = toPool(database);
  const reason = form.get('reason')?.trim() || undefined;
  switch (path) {
    case '/limits/pause': {
      const ms = form.get('for') ?? '';
      if (ms !== '' && !(/^[1-9][0-9]{0,10}$/.test(ms) && Number(ms) <= MAX_PAUSE_MS)) {
        throw new FlowControlError(`outlive: a pause lasts a whole number of milliseconds up to ${MAX_PAUSE_MS}, or until resumed`);
      }
      await pauseKey(db, form.get('key') ?? '', { until: ms === '' ? undefined : new Date(Date.now() + Number(ms)), reason });
      return 'key-paused';
    }
    case '/limits/resume':
      return (await resumeKey(db, form.get('key') ?? '')) ? 'key-resumed' : 'key-not-resumed';
    case '/queues/pause':
      await pauseQueue(db, form.get('queue')?.trim() ?? '', { reason });
      return 'queue-paused';
    default:
      return (await resumeQueue(db, form.get('queue') ?? '')) ? 'queue-resumed' : 'queue-not-paused';
  }
}
