/**
 * The dashboard as one Web handler, `Request` in and `Response` out, so the
 * Cloudflare Worker, the Vercel functions and the local stack serve the same
 * pages: `handleDashboard(request, db, { token, basePath })`.
 *
 * Routes under `basePath`: `/` the overview, `/runs/:id`, `/tasks/:id`,
 * `/limits`, and the actions `POST /tasks/:id/retry`, `POST /runs/:id/retry`,
 * `POST /runs/:id/cancel`, `POST /limits/pause` and `/limits/resume` (form
 * field `key`; `for` in ms and `reason` to pause), `POST /queues/pause` and
 * `/queues/resume` (`queue`; `reason` to pause). Without the token every
 * route answers 401 and shows nothing.
 */
import { checkWhole, MIN_SECRET_LENGTHS, parseId } from '../../model/checks.js';
import { cancelRun } from '../../admin/cancel.js';
import { toError } from '../../model/errors.js';
import { toPool, type Database } from '../../db/executor.js';
import { explainRun } from '../../admin/explain.js';
import { secretsEqual } from '../nudge.js';
import { retryRun, retryTask } from '../../admin/retry.js';
import { FlowControlError, pauseKey, pauseQueue, resumeKey, resumeQueue } from '../../admin/flow.js';
import { credentialOf, csrfValue, DEFAULT_SESSION_SECONDS, sameSiteForm, sessionCookie } from './auth.js';
import { limitsPage, messagePage, overviewPage, runPage, taskPage, type PageContext } from './pages.js';
import { finishedPerMinute, getTask, listFailures, listKeys, listRuns, listSchedules, pausedQueues, runEdges, status } from '../../admin/queries.js';

/** How the dashboard is mounted and protected. */
export interface DashboardOptions {
  /** The token a visitor must present (`OUTLIVE_DASHBOARD_TOKEN`). Without one the dashboard is off: 401 for all. */
  token: string | undefined;
  /** Where the dashboard lives, e.g. `/dashboard` (no trailing slash). Default `/dashboard`. */
  basePath?: string;
  /** Seconds between the pages' automatic refreshes; 0 turns it off. Default 5. */
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
    const ctx: PageContext = {
      basePath,
      csrf: await csrfValue(token),
      refreshSeconds: url.searchParams.get('refresh') === '0' ? 0 : (options.refreshSeconds ?? 5),
      now: new Date(),
      flash: FLASH[url.searchParams.get('flash') ?? ''] ?? null,
    };
    if (path === '/') {
      const [s, throughput, runs, failures, schedules] = await Promise.all([
        status(db), finishedPerMinute(db, 60), listRuns(db, { limit: 20 }), listFailures(db, 20), listSchedules(db),
      ]);
      ctx.now = s.now;
      return page(200, overviewPage(ctx, { status: s, throughput, runs, failures, schedules }));
    }
    let m = new RegExp(`^/runs/${ID}$`).exec(path);
    if (m) {
      const id = parseId('run', m[1]);
      if (id === null) return page(404, messagePage('Not found', `There is no run ${m[1]}.`));
      const [run, edges] = await Promise.all([explainRun(db, id), runEdges(db, id)]);
      if (!run) return page(404, messagePage('Not found', `There is no run ${m[1]}.`));
      return page(200, runPage(ctx, run, edges));
    }
    m = new RegExp(`^/tasks/${ID}$`).exec(path);
    if (m) {
      const task = await getTask(db, m[1]!); // null for an id beyond a bigint, as for one with no row
      if (!task) return page(404, messagePage('Not found', `There is no task ${m[1]}.`));
      return page(200, taskPage(ctx, task));
    }
    if (path === '/limits') {
      const [{ keys, total }, queues] = await Promise.all([listKeys(db, { limit: MAX_KEYS_SHOWN }), pausedQueues(db)]);
      return page(200, limitsPage(ctx, { keys, total, queues }));
    }
    return page(404, messagePage('Not found', 'There is nothing here.'));
  } catch (err) {
    // The message may name the database's host; log it, show only that it failed.
    log(toError(err).message.split('\n')[0]!);
    return page(500, messagePage('The database did not answer', 'The dashboard could not read the rows; see the function\'s log.'));
  }
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
