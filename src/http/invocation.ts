/**
 * One invocation of a serverless function, whatever the platform: its
 * settings read from the environment, its own pool (node-postgres or Neon's
 * driver, as `src/db/connect.ts` decides), the tasks it runs, a log that
 * never prints a secret, and the bounded pass itself.
 *
 * Platform entry points (`cloudflare.ts`, `vercel/`) only say what their
 * platform allows (the budget ceiling, whether work may continue after the
 * response) and hand requests to `drain.ts` and `cron.ts`.
 */
import { isWhole } from '../model/checks.js';
import { ConfigError, toError } from '../model/errors.js';
import { connectionSecrets, redactor } from '../model/redact.js';
import { chooseDatabase, openInvocationPool, type DatabaseChoice, type InvocationPool, type Runtime } from '../db/connect.js';
import type { TaskList } from '../model/task.js';
import type { AnySchedule } from '../maintenance/schedule.js';
import { PassError, tick, type TickReport } from '../pass/tick.js';
import { telemetry } from '../model/telemetry.js';

/** The environment the functions read (Worker bindings, or `process.env` on Vercel). */
export interface FunctionsEnv {
  /** The database's connection string. Secret. On Workers, a Hyperdrive binding may take its place. */
  DATABASE_URL?: string;
  /** Workers: a Hyperdrive binding, used with node-postgres (`createCloudflareWorker(tasks, { pg })`). */
  HYPERDRIVE?: unknown;
  /** Shared secret of the drain webhook's HMAC signatures. Secret. */
  OUTLIVE_DRAIN_SECRET?: string;
  /** The drain's public URLs or endpoint ids, comma-separated, that nudges are signed for; default the URL a request arrives at. */
  OUTLIVE_DRAIN_URL?: string;
  /**
   * Signing secrets of the signal endpoint (`POST /signal`) for Standard
   * Webhooks calls, as providers show them (`whsec_<base64>`; a secret
   * without the prefix is taken as its UTF-8 bytes), comma- or
   * space-separated: several while a key rotates, or one per provider. Secret.
   */
  OUTLIVE_SIGNAL_SECRETS?: string;
  /** The signal endpoint's public URLs or endpoint ids, comma-separated, that outlive-signed (v2) signals are signed for; default the URL a request arrives at. */
  OUTLIVE_SIGNAL_URL?: string;
  /** Vercel's cron secret, sent as `Authorization: Bearer ...`. Secret. */
  CRON_SECRET?: string;
  /** The dashboard's token (`/dashboard`); without it the dashboard answers 401. Secret. */
  OUTLIVE_DASHBOARD_TOKEN?: string;
  /** The Neon driver only: a WebSocket proxy in front of a Postgres that is not Neon (tests only; node-postgres needs none). */
  NEON_WS_PROXY?: string;
  /** Lowers the pass's budget below the platform's ceiling (ms). */
  OUTLIVE_BUDGET_MS?: string;
  /** Workers only: the `[limits] cpu_ms` the Worker is deployed with (ms), which its budgets follow. Default 30000. */
  OUTLIVE_CPU_MS?: string;
  /** Handlers running at once in a pass. Default 10. */
  OUTLIVE_CONCURRENCY?: string;
  [binding: string]: unknown;
}

/** What a task handler may use during one invocation. */
export interface TaskDeps {
  env: FunctionsEnv;
  /** The invocation's pool; handlers may query it (keep queries short: it is shared with the pass). */
  pool: InvocationPool;
}

/** What a deployment runs: its tasks and, optionally, the schedules its cron tick fires. */
export interface Deployment {
  tasks: TaskList;
  schedules?: readonly AnySchedule[];
}

/**
 * The tasks a deployment runs (a list, or a {@link Deployment} with
 * schedules), built once per invocation, so handlers can use the
 * invocation's bindings and pool (on Workers both are per request).
 */
export type TasksFor = (deps: TaskDeps) => TaskList | Deployment;

/** Why a pass ran. */
export type Trigger = 'cron' | 'drain';

/** One invocation's resources and settings. */
export interface Invocation {
  /** Names the platform in logs and lease owners (`cloudflare`, `vercel`); owners read `cloudflare:drain:<uuid>`. */
  readonly platform: string;
  readonly env: FunctionsEnv;
  /** The driver and where its connection string came from (never the string itself in a log). */
  readonly database: DatabaseChoice;
  readonly pool: InvocationPool;
  readonly tasks: TaskList;
  /** Schedules the cron tick fires before its pass. */
  readonly schedules: readonly AnySchedule[];
  readonly budgetMs: number;
  readonly concurrency: number | undefined;
  /**
   * True where the platform routes requests by their host (Cloudflare
   * Workers; Vercel, deployed), so a request's URL names this deployment. A
   * self-hosted server builds it from the client's Host header, which may
   * name another deployment: its drain and signal endpoints must be
   * configured (`OUTLIVE_DRAIN_URL`, `OUTLIVE_SIGNAL_URL`).
   */
  readonly routedByHost: boolean;
  /** Continues work after the response (Workers' `ctx.waitUntil`), where the platform allows; else null. */
  readonly background: ((work: Promise<unknown>) => void) | null;
  /** Writes one structured log line, with every secret of the environment blanked out. */
  log(event: string, fields?: Record<string, unknown>): void;
  /** Blanks out every secret of the environment in a text. */
  redact(text: string): string;
  /** Waits for background work, flushes telemetry (if registered), then closes the pool. Never rejects. */
  close(): Promise<void>;
}

/**
 * The longest pass that fits in a platform's limit on an invocation (ms):
 * the limit less what is kept back for the last settles and closing the
 * pool, a tenth of the limit and at least 5 s (half the limit, for a limit
 * under 10 s). Never less than 1 ms.
 */
export function budgetWithin(limitMs: number): number {
  const kept = Math.max(Math.min(5_000, limitMs / 2), limitMs / 10);
  return Math.max(1, Math.floor(limitMs - kept));
}

/** How an entry point opens its invocation. */
export interface InvocationOptions {
  platform: string;
  tasks: TasksFor;
  /**
   * The longest pass this entry point can afford on its platform (ms). The
   * environment may lower it, never raise it: a pass longer than its platform
   * allows is killed mid-task.
   */
  budgetCeilingMs: number;
  waitUntil?: (work: Promise<unknown>) => void;
  /** What the runtime has: `src/db/connect.ts` picks the driver from it. */
  runtime: Runtime;
  /** Whether the platform routes requests by host, so their URL can be trusted (see {@link Invocation.routedByHost}). */
  routedByHost: boolean;
  /** For the Neon driver on runtimes without a global WebSocket (Node before 22). */
  webSocketConstructor?: unknown;
  /** Where log lines go. Default `console.log`. */
  write?: (line: string) => void;
}

const SECRET_NAMES = ['DATABASE_URL', 'OUTLIVE_DRAIN_SECRET', 'CRON_SECRET', 'OUTLIVE_DASHBOARD_TOKEN', 'OUTLIVE_SIGNAL_SECRETS'] as const;

function secretsOf(env: FunctionsEnv): unknown[] {
  const secrets: unknown[] = SECRET_NAMES.map((name) => env[name]);
  // Each signal secret on its own too, with and without its prefix: a log may quote one entry of the list.
  const signalSecrets = env.OUTLIVE_SIGNAL_SECRETS;
  if (typeof signalSecrets === 'string') {
    for (const entry of signalSecrets.split(/[\s,]+/)) secrets.push(entry, entry.replace(/^whsec_/, ''));
  }
  // Hyperdrive's connection string holds credentials it generated; a driver error may quote either password.
  const hyperdrive = (env.HYPERDRIVE as { connectionString?: unknown } | undefined)?.connectionString;
  secrets.push(...connectionSecrets(env.DATABASE_URL), ...connectionSecrets(hyperdrive));
  return secrets;
}

function positiveIntFrom(env: FunctionsEnv, name: 'OUTLIVE_BUDGET_MS' | 'OUTLIVE_CONCURRENCY'): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  const value = Number(raw);
  if (!isWhole(value, { min: 1 })) {
    throw new ConfigError(`outlive: ${name} must be a whole number >= 1, got ${JSON.stringify(raw)}; unset it for the default`);
  }
  return value;
}

/**
 * Opens an invocation: reads and checks the settings (throwing
 * {@link ConfigError} that names the fix), and makes a pool that connects on
 * first use.
 */
export function openInvocation(env: FunctionsEnv, options: InvocationOptions): Invocation {
  const redact = redactor(secretsOf(env));
  const write = options.write ?? ((line: string) => console.log(line));
  const log = (event: string, fields: Record<string, unknown> = {}) => {
    // Strings are redacted before JSON escapes them (a secret with a quote in
    // it would not match once escaped), and the line once more after.
    const line = JSON.stringify({ outlive: event, platform: options.platform, ...fields }, (_key, value: unknown) =>
      typeof value === 'string' ? redact(value) : value,
    );
    write(redact(line));
  };

  const database = chooseDatabase(env, options.runtime);
  const requested = positiveIntFrom(env, 'OUTLIVE_BUDGET_MS');
  let budgetMs = options.budgetCeilingMs;
  if (requested !== undefined && requested > options.budgetCeilingMs) {
    log('budget-capped', { requestedMs: requested, budgetMs });
  } else if (requested !== undefined) {
    budgetMs = requested;
  }
  const concurrency = positiveIntFrom(env, 'OUTLIVE_CONCURRENCY');
  const pool = openInvocationPool(database, {
    pg: options.runtime.pg,
    wsProxy: typeof env.NEON_WS_PROXY === 'string' && env.NEON_WS_PROXY ? env.NEON_WS_PROXY : undefined,
    webSocketConstructor: options.webSocketConstructor,
  });
  // An idle client that errors (the socket closed under it) must not crash
  // the isolate. Its message only: the client itself holds the cancel key.
  // A client the pool ends on purpose errors as its socket closes
  // (node-postgres on workerd: "Stream was cancelled."): once the pool is
  // ending, and for a client given back with an error (a failed query's),
  // that is the ending itself, not news.
  let ending = false;
  const ended = new WeakSet<object>();
  pool.on('release', (err: unknown, client: object) => {
    if (err) ended.add(client);
  });
  pool.on('error', (err: unknown, client?: object) => {
    if (!ending && !(client && ended.has(client))) log('pool-error', { driver: database.driver, error: toError(err).message });
  });
  const built = options.tasks({ env, pool });
  const deployment: Deployment = Array.isArray(built) || built instanceof Map ? { tasks: built as TaskList } : (built as Deployment);
  const tasks = deployment.tasks;
  const schedules = deployment.schedules ?? [];

  const pending: Promise<unknown>[] = [];
  const background = options.waitUntil
    ? (work: Promise<unknown>) => {
        const settled = work.catch((err) => log('background-error', { error: toError(err).message }));
        pending.push(settled);
        options.waitUntil!(settled);
      }
    : null;

  let closing: Promise<void> | null = null;
  return {
    platform: options.platform,
    env,
    database,
    pool,
    tasks,
    schedules,
    budgetMs,
    concurrency,
    routedByHost: options.routedByHost,
    background,
    log,
    redact,
    close() {
      closing ??= (async () => {
        // Background passes hold the pool until they are done.
        while (pending.length > 0) await Promise.all(pending.splice(0));
        // Every route closes its invocation in the platform's waitUntil, so
        // buffered spans and metrics are exported before the isolate is frozen.
        await telemetry()?.flush();
        ending = true;
        try {
          await pool.end();
        } catch (err) {
          log('pool-end-error', { error: toError(err).message });
        }
      })();
      return closing;
    },
  };
}

/** Options of one pass beyond what the invocation fixes. */
export interface PassOptions {
  /** Claim only from these queues. */
  queues?: readonly string[];
}

/**
 * Runs one bounded pass (recovery of expired leases, then claims until the
 * budget is nearly spent or nothing is ready) and logs its report. A
 * database failure is logged (redacted) and rethrown as a {@link PassError}
 * whose message is redacted too.
 */
export async function runPass(inv: Invocation, trigger: Trigger, options: PassOptions = {}): Promise<TickReport> {
  try {
    const report = await tick(inv.pool, {
      tasks: inv.tasks,
      budgetMs: inv.budgetMs,
      ...(inv.concurrency === undefined ? {} : { concurrency: inv.concurrency }),
      ...(options.queues ? { queues: options.queues } : {}),
      owner: `${inv.platform}:${trigger}`,
      redact: inv.redact,
    });
    inv.log('pass', { trigger, driver: inv.database.driver, budgetMs: inv.budgetMs, ...report });
    return report;
  } catch (thrown) {
    const err = toError(thrown);
    const report = err instanceof PassError ? err.report : undefined;
    inv.log('pass-failed', { trigger, driver: inv.database.driver, database: inv.database.from, error: err.message, ...(report ?? {}) });
    // No `cause`: a platform that prints the thrown error would print the unredacted one.
    if (report) throw new PassError(inv.redact(err.message), report, { cause: undefined });
    throw new Error(inv.redact(err.message));
  }
}

/** A JSON response. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers },
  });
}
