/**
 * The `outlive` command line: what a person on call reaches for.
 *
 *   outlive migrate | status | tasks | runs | run <id> | task <id>
 *   outlive grants --app <role> --worker <role> --dashboard <role>
 *   outlive retry task <id> | retry run <id> | cancel run <id>
 *   outlive limits | limit set|pause|resume <key> | queue pause|resume <queue> | weight <queue> <key> <n>
 *   outlive enqueue <name> <json> --tasks ./dist/tasks.js
 *   outlive worker --tasks ./dist/tasks.js
 *
 * Each command is one `register*` function adding itself to the program. The
 * database comes from `--database-url` or `DATABASE_URL`. Output is a table
 * for people, or JSON with `--json`. Failures print one line, `outlive: what
 * went wrong`, no stack trace, and exit with a code that says what kind:
 * 0 ok, 1 the operation failed or found nothing, 2 bad usage or input,
 * 3 the database cannot be reached.
 */
import { formatIssues, parseId } from '../model/checks.js';
import { isInputSchema, validate } from '../model/input-schema.js';
import { printable, quoted } from '../model/printable.js';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import pg from 'pg';
import { ConfigError, InvalidEnqueueError, toError } from '../model/errors.js';
import { cancelRun } from '../admin/cancel.js';
import { enqueue } from '../write/enqueue.js';
import { explainRun, type ExplainedTask } from '../admin/explain.js';
import { migrate, MIGRATIONS_FOLDER } from './migrate.js';
import { grants } from './grants.js';
import { retryRun, retryTask, type RetryReport } from '../admin/retry.js';
import {
  formatPeriod, getTask, keyStates, keyWait, listKeys, listRuns, listTasks, pausedQueues, pauseText, progressText, roomText, runEdges, status,
  type KeyState, type StatusReport,
} from '../admin/queries.js';
import { FlowControlError, pauseKey, pauseQueue, resumeKey, resumeQueue, setLimit, setWeight, type LimitOverride } from '../admin/flow.js';
import { RUN_STATES, TASK_STATES, type RunState, type TaskState } from '../model/states.js';
import { isSchedule, type AnySchedule } from '../maintenance/schedule.js';
import type { AnyTask } from '../model/task.js';
import { createWorker, type Worker, type WorkerLogger } from './worker.js';

/** Where the CLI writes, replaceable for tests. */
export interface CliIo {
  out(line: string): void;
  err(line: string): void;
}

const processIo: CliIo = {
  out: (line) => process.stdout.write(line + '\n'),
  err: (line) => process.stderr.write(line + '\n'),
};

/** Exit codes: what kind of failure a script is looking at. */
export const EXIT = { ok: 0, failed: 1, usage: 2, unreachable: 3 } as const;

/** An error the CLI reports as one line, with its exit code (default 1: the operation failed). */
export class CliError extends Error {
  constructor(message: string, readonly exitCode: number = EXIT.failed) {
    super(message);
  }
}

/** A commander argument parser for whole numbers at least `min`. */
export function wholeNumber(min: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected a whole number >= ${min}`);
    return n;
  };
}

function isTask(value: unknown): value is AnyTask {
  const v = value as AnyTask;
  return (
    typeof v === 'object' && v !== null && typeof v.name === 'string' && typeof v.run === 'function' &&
    isInputSchema(v.input) && typeof v.timeoutMs === 'number'
  );
}

/** What a tasks module gave: its tasks and schedules. */
export interface LoadedModule {
  tasks: AnyTask[];
  schedules: AnySchedule[];
}

/**
 * Loads the module that exports the tasks (and schedules). It may export
 * `tasks` and `schedules` arrays, a default export holding them, or the tasks
 * and schedules themselves as named exports.
 */
export async function loadTasksModule(specifier: string, cwd = process.cwd()): Promise<LoadedModule> {
  const file = path.resolve(cwd, specifier);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (err) {
    const e = toError(err) as Error & { code?: string };
    if (e.code === 'ERR_MODULE_NOT_FOUND' && e.message.includes(file)) throw new CliError(`cannot find the tasks module ${file}`);
    if (e.code === 'ERR_UNKNOWN_FILE_EXTENSION') {
      throw new CliError(`cannot load ${file}: ${e.message}; compile it to JavaScript, or run node with --import tsx`);
    }
    throw new CliError(`cannot load the tasks module ${file}: ${e.message.split('\n')[0]}`);
  }
  const holder = (mod.default && typeof mod.default === 'object' ? mod.default : mod) as Record<string, unknown>;
  const list = (key: string): unknown[] | undefined => {
    const v = holder[key] ?? mod[key];
    if (v === undefined) return undefined;
    if (!Array.isArray(v)) throw new CliError(`${file}: the export \`${key}\` must be an array`);
    return v;
  };
  const values = [...new Set([...Object.values(mod), ...(holder === mod ? [] : Object.values(holder))])];
  const tasks = list('tasks') ?? values.filter(isTask);
  const schedules = list('schedules') ?? values.filter(isSchedule);
  const badTask = tasks.find((t) => !isTask(t));
  if (badTask !== undefined) throw new CliError(`${file}: \`tasks\` holds something that is not a task made by defineTask()`);
  const badSchedule = schedules.find((s) => !isSchedule(s));
  if (badSchedule !== undefined) throw new CliError(`${file}: \`schedules\` holds something that is not a schedule made by defineSchedule()`);
  if (tasks.length === 0 && schedules.length === 0) {
    throw new CliError(`${file} exports no tasks: export \`tasks\` (an array of defineTask() results), or the tasks themselves`);
  }
  return { tasks: tasks as AnyTask[], schedules: schedules as AnySchedule[] };
}

/** How the worker command waits for its end; replaceable for tests. */
export interface SignalSource {
  once(signal: 'SIGTERM' | 'SIGINT', listener: () => void): unknown;
  removeListener(signal: 'SIGTERM' | 'SIGINT', listener: () => void): unknown;
}

function registerWorker(program: Command, io: CliIo, signals: SignalSource, setExit: (code: number) => void): void {
  program
    .command('worker')
    .description('Run a long-lived worker: LISTEN for enqueued tasks, poll as a safety net, fire schedules, apply retention.')
    .addOption(new Option('--database-url <url>', 'Postgres connection string').env('DATABASE_URL'))
    .addOption(
      new Option('--listen-database-url <url>', 'a direct connection string for LISTEN alone, when --database-url goes through a transaction pooler').env(
        'LISTEN_DATABASE_URL',
      ),
    )
    .requiredOption('--tasks <module>', 'module exporting the tasks (and schedules) to run')
    .option('--concurrency <n>', 'handlers running at once', wholeNumber(1), 10)
    .option('--queues <names>', 'only these queues, comma-separated')
    .option('--poll-interval-ms <ms>', 'longest gap between passes without a notification', wholeNumber(1), 2_000)
    .option('--grace-ms <ms>', 'on SIGTERM/SIGINT, how long running tasks may finish before they are aborted', wholeNumber(0), 30_000)
    .option('--no-retention', 'do not delete old finished tasks and runs')
    .action(async (opts: {
      databaseUrl?: string;
      listenDatabaseUrl?: string;
      tasks: string;
      concurrency: number;
      queues?: string;
      pollIntervalMs: number;
      graceMs: number;
      retention: boolean;
    }) => {
      if (!opts.databaseUrl) throw new CliError('no database: pass --database-url postgres://... or set DATABASE_URL');
      const loaded = await loadTasksModule(opts.tasks);
      const logger: WorkerLogger = { info: io.out, warn: io.err, error: io.err };
      const worker: Worker = createWorker({
        connectionString: opts.databaseUrl,
        ...(opts.listenDatabaseUrl ? { listenConnectionString: opts.listenDatabaseUrl } : {}),
        tasks: loaded.tasks,
        schedules: loaded.schedules,
        concurrency: opts.concurrency,
        queues: opts.queues ? opts.queues.split(',').map((q) => q.trim()).filter(Boolean) : undefined,
        pollIntervalMs: opts.pollIntervalMs,
        retention: opts.retention ? {} : false,
        logger,
        onPass: (r) => {
          if (r.claimed > 0) {
            io.out(`outlive worker: pass claimed ${r.claimed}: ${r.succeeded} succeeded, ${r.retried} to retry, ${r.failed} failed (${r.durationMs} ms)`);
          }
        },
      });
      // Installed before start, so a signal during startup is not the default (immediate) exit.
      let signalled = 0;
      let stopped!: () => void;
      const done = new Promise<void>((resolve) => (stopped = resolve));
      const onSignal = (name: string) => () => {
        signalled++;
        if (signalled === 1) {
          io.out(`outlive worker: ${name} received: stopping (grace ${opts.graceMs} ms; send it again to abort running tasks)`);
          void worker.stop({ graceMs: opts.graceMs }).then(stopped, (err: unknown) => {
            io.err(`outlive: ${toError(err).message}`);
            setExit(1);
            stopped();
          });
        } else {
          io.out(`outlive worker: ${name} received again: aborting running tasks`);
          void worker.stop({ graceMs: 0 });
        }
        // Listen again for the second signal.
        signals.once(name as 'SIGTERM', handlers[name as 'SIGTERM']);
      };
      const handlers = { SIGTERM: onSignal('SIGTERM'), SIGINT: onSignal('SIGINT') };
      signals.once('SIGTERM', handlers.SIGTERM);
      signals.once('SIGINT', handlers.SIGINT);
      try {
        await worker.start();
        await done;
      } finally {
        signals.removeListener('SIGTERM', handlers.SIGTERM);
        signals.removeListener('SIGINT', handlers.SIGINT);
      }
    });
}

/**
 * The CLI's output, each line escaped: task names, queues, keys, errors, lease
 * owners and run names come from rows that other roles may have written, and
 * a newline in one would forge a line, an escape sequence drive the
 * operator's terminal. Commands write one line per call; what is meant to be
 * several lines (help, JSON) is split first.
 */
function printableIo(io: CliIo): CliIo {
  return { out: (line) => io.out(printable(line)), err: (line) => io.err(printable(line)) };
}

function lines(text: string): string[] {
  return text.replace(/\n$/, '').split('\n');
}

/** Builds the program with every command registered. */
export function createProgram(io: CliIo = processIo, signals: SignalSource = process, setExit: (code: number) => void = () => undefined): Command {
  io = printableIo(io);
  const program = new Command('outlive')
    .description('Durable jobs and DAG runs for serverless TypeScript, kept in Postgres rows.')
    .exitOverride()
    .configureOutput({
      writeOut: (s) => lines(s).forEach(io.out),
      writeErr: (s) => lines(s).forEach(io.err),
      outputError: (s, write) => write(s.replace(/^error: /, 'outlive: ')),
    })
    .showSuggestionAfterError();
  registerInspect(program, io);
  registerWorker(program, io, signals, setExit);
  return program;
}

/**
 * Runs the CLI with the user's arguments (`process.argv.slice(2)`); resolves
 * with the exit code. Every failure is reported as one line.
 */
export async function main(args: readonly string[], io: CliIo = processIo, signals: SignalSource = process): Promise<number> {
  io = printableIo(io);
  let code = 0;
  const program = createProgram(io, signals, (c) => (code = c));
  if (args.length === 0) {
    program.outputHelp();
    return EXIT.usage;
  }
  try {
    await program.parseAsync([...args], { from: 'user' });
    return code;
  } catch (err) {
    // Commander already printed its own message (unknown option, missing argument, --help).
    if (err instanceof CommanderError) {
      // --help and --version exit 0; help shown because a command was incomplete is a usage error.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    const e = toError(err);
    const known = e instanceof CliError || e instanceof ConfigError;
    const message = e.message.replace(/^outlive: /, '').split('\n')[0];
    io.err(`outlive: ${known ? message : `${e.name}: ${message}`}`);
    return e instanceof CliError ? e.exitCode : EXIT.failed;
  }
}

// ---------------------------------------------------------------------------
// Inspecting and steering: migrate, status, tasks, runs, run, task, retry,
// cancel, enqueue.

/** The options every database command takes. */
interface DbOptions {
  databaseUrl?: string;
  json?: boolean;
}

function withDbOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option('--database-url <url>', 'Postgres connection string').env('DATABASE_URL'))
    .option('--json', 'print JSON for scripts instead of a table');
}

/** Where a connection string points, without its password. */
function describeUrl(url: URL): string {
  return `${url.hostname}${url.port ? `:${url.port}` : ''}${url.pathname}`;
}

function parseUrl(raw: string | undefined): URL {
  if (!raw) throw new CliError('no database: pass --database-url postgres://... or set DATABASE_URL', EXIT.usage);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new CliError('the database URL is not a URL: expected postgres://user:password@host:port/database', EXIT.usage);
  }
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') {
    throw new CliError(`the database URL must start with postgres:// or postgresql://, not ${url.protocol}//`, EXIT.usage);
  }
  return url;
}

const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'ECONNRESET', 'EHOSTUNREACH', '28P01', '28000', '3D000']);

/**
 * Opens a pool on the database, checks that it answers, runs `fn`, and closes
 * the pool. An unreachable database is exit code 3; a database without the
 * outlive schema says to run `outlive migrate`.
 */
async function withDb<T>(opts: DbOptions, fn: (pool: pg.Pool) => Promise<T>, needsSchema = true): Promise<T> {
  const url = parseUrl(opts.databaseUrl);
  const pool = new pg.Pool({ connectionString: url.toString(), max: 4, connectionTimeoutMillis: 10_000 });
  // A dropped idle connection must not crash the process with an unhandled 'error'.
  pool.on('error', () => undefined);
  try {
    try {
      const [row] = (await pool.query<{ ok: boolean }>(`SELECT pg_catalog.to_regclass('outlive.tasks') IS NOT NULL AS ok`)).rows;
      if (needsSchema && !row!.ok) {
        throw new CliError(`the database ${describeUrl(url)} has no outlive schema: run \`outlive migrate\` first`, EXIT.failed);
      }
    } catch (err) {
      if (err instanceof CliError) throw err;
      const e = toError(err) as Error & { code?: string };
      const why = e.message.split('\n')[0] || e.code || 'no answer';
      if (UNREACHABLE_CODES.has(e.code ?? '') || /timeout|connect/i.test(e.message)) {
        throw new CliError(`cannot reach the database at ${describeUrl(url)}: ${why}`, EXIT.unreachable);
      }
      throw new CliError(`the database at ${describeUrl(url)} answered with an error: ${why}`, EXIT.unreachable);
    }
    return await fn(pool);
  } finally {
    await pool.end().catch(() => undefined);
  }
}

/** Formats rows as an aligned text table. */
export function table(headers: string[], rows: (string | number | null | undefined)[][]): string[] {
  // Escaped before the widths are measured, so the columns stay aligned.
  const cells = rows.map((r) => r.map((c) => printable((c === null || c === undefined ? '-' : String(c)).replace(/\s+/g, ' '))));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => Math.min(r[i]!.length, 80))));
  const line = (r: string[]) =>
    r.map((c, i) => (c.length > 80 ? c.slice(0, 79) + '…' : c).padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...cells.map(line)];
}

/** "3s", "4m 10s", "2h 5m", "3d 4h". */
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function ago(d: Date | null, now = new Date()): string | null {
  return d ? `${duration(now.getTime() - d.getTime())} ago` : null;
}

function printJson(io: CliIo, value: unknown): void {
  // JSON.stringify escapes newlines inside strings, so these are its own.
  for (const line of JSON.stringify(value, null, 2).split('\n')) io.out(line);
}

function oneOf<S extends string>(what: string, allowed: readonly S[]) {
  return (value: string): S => {
    if (!(allowed as readonly string[]).includes(value)) throw new InvalidArgumentError(`expected a ${what}: ${allowed.join(', ')}`);
    return value as S;
  };
}

/** A commander argument parser for ids: digits, or a usage error. An id no row can have is passed on, to be "not found". */
function id(what: 'task' | 'run') {
  return (value: string): string => {
    try {
      parseId(what, value);
    } catch {
      throw new InvalidArgumentError(`expected a ${what} id (a positive whole number)`);
    }
    return value;
  };
}

function registerMigrate(program: Command, io: CliIo): void {
  withDbOptions(program.command('migrate'))
    .description('Create or update the outlive schema (safe to run on every deploy, and from several processes at once).')
    .action(async (opts: DbOptions) => {
      const url = parseUrl(opts.databaseUrl);
      const progress = (line: string) => (opts.json ? io.err(line) : io.out(line));
      progress(`outlive migrate: connecting to ${describeUrl(url)}`);
      // Nothing of schema outlive is read before migrate has checked it: a
      // planted view named outlive.migrations would run as the migrating role.
      await withDb(opts, async () => {
        progress(`outlive migrate: applying what is not applied yet from ${MIGRATIONS_FOLDER}`);
        const started = Date.now();
        const { applied, total } = await migrate(url.toString());
        if (opts.json) printJson(io, { applied: applied.length, total, durationMs: Date.now() - started });
        else io.out(`outlive migrate: done: ${applied.length} applied now, ${total} in all (${Date.now() - started} ms)`);
      }, false);
    });
}

function registerStatus(program: Command, io: CliIo): void {
  withDbOptions(program.command('status'))
    .description('Counts by state and queue, the oldest ready task, failures in the last hour, and what flow control holds back (keys tasks wait for, paused keys and queues).')
    .action(async (opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const s = await status(pool);
        if (opts.json) return printJson(io, s);
        io.out(`tasks:  ${TASK_STATES.map((st) => `${st} ${s.tasks[st]}`).join(', ')}`);
        io.out(`runs:   ${RUN_STATES.map((st) => `${st} ${s.runs[st]}`).join(', ')}`);
        io.out(`oldest ready task: ${s.oldestReadyMs === null ? 'none waiting' : `due ${duration(s.oldestReadyMs)} ago`}`);
        io.out(`failed in the last hour: ${s.failedLastHour}`);
        for (const u of s.unrunnable) io.out(`not runnable: ${u.ready} ready ${quoted(u.name)} task(s): ${u.why}`);
        for (const w of s.waits) io.out(waitLine(w));
        for (const q of s.pausedQueues) {
          const pending = s.queues.find((x) => x.queue === q.queue)?.counts.pending ?? 0;
          io.out(`queue ${q.queue} is paused: ${q.reason ?? 'no reason given'} (since ${q.pausedAt.toISOString()}; ${pending} pending)`);
        }
        if (s.queues.length > 0) {
          io.out('');
          for (const l of table(['queue', ...TASK_STATES], s.queues.map((q) => [q.queue, ...TASK_STATES.map((st) => q.counts[st])]))) io.out(l);
        }
      });
    });
}

function registerTasks(program: Command, io: CliIo): void {
  withDbOptions(program.command('tasks'))
    .description('List tasks, newest first.')
    .option('--state <state>', `only tasks in this state (${TASK_STATES.join(', ')})`, oneOf('task state', TASK_STATES))
    .option('--name <name>', 'only tasks of this name')
    .option('--queue <queue>', 'only tasks of this queue')
    .option('--run <id>', 'only tasks of this run', id('run'))
    .option('--limit <n>', 'at most this many', wholeNumber(1), 50)
    .action(async (opts: DbOptions & { state?: TaskState; name?: string; queue?: string; run?: string; limit: number }) => {
      await withDb(opts, async (pool) => {
        // A run id no row can have (beyond a bigint) matches nothing.
        const runId = opts.run === undefined ? undefined : parseId('run', opts.run);
        const tasks = runId === null ? [] : await listTasks(pool, { state: opts.state, name: opts.name, queue: opts.queue, runId, limit: opts.limit });
        if (opts.json) return printJson(io, tasks);
        if (tasks.length === 0) return io.out('no tasks match');
        const now = new Date();
        for (const l of table(
          ['id', 'name', 'queue', 'state', 'attempts', 'run', 'created', 'last error'],
          tasks.map((t) => [t.id, t.name, t.queue, t.state, `${t.attempts}/${t.maxAttempts}`, t.runId, ago(t.createdAt, now), t.lastError]),
        )) io.out(l);
      });
    });
}

function registerRuns(program: Command, io: CliIo): void {
  withDbOptions(program.command('runs'))
    .description('List runs, newest first, with their progress (tasks done of total).')
    .option('--state <state>', `only runs in this state (${RUN_STATES.join(', ')})`, oneOf('run state', RUN_STATES))
    .option('--limit <n>', 'at most this many', wholeNumber(1), 50)
    .action(async (opts: DbOptions & { state?: RunState; limit: number }) => {
      await withDb(opts, async (pool) => {
        const runs = await listRuns(pool, { state: opts.state, limit: opts.limit });
        if (opts.json) return printJson(io, runs);
        if (runs.length === 0) return io.out('no runs match');
        const now = new Date();
        for (const l of table(
          ['id', 'name', 'state', 'done', 'failed', 'created', 'error'],
          runs.map((r) => [r.id, r.name, r.state, `${r.done}/${r.total}`, r.failed, ago(r.createdAt, now), r.error]),
        )) io.out(l);
      });
    });
}

/**
 * Orders a run's tasks as a tree: each task hangs under its deepest
 * dependency (so it appears once), roots are the tasks that wait for none.
 */
export function runTree(tasks: readonly ExplainedTask[], edges: readonly { task: string; dependsOn: string }[]): { task: ExplainedTask; depth: number; last: boolean[] }[] {
  const byId = new Map(tasks.map((t) => [t.id, t]));
  const deps = new Map<string, string[]>();
  for (const e of edges) if (byId.has(e.dependsOn)) deps.set(e.task, [...(deps.get(e.task) ?? []), e.dependsOn]);
  const level = new Map<string, number>();
  const levelOf = (taskId: string, seen = new Set<string>()): number => {
    const known = level.get(taskId);
    if (known !== undefined) return known;
    if (seen.has(taskId)) return 0;
    seen.add(taskId);
    const l = Math.max(-1, ...(deps.get(taskId) ?? []).map((d) => levelOf(d, seen))) + 1;
    level.set(taskId, l);
    return l;
  };
  const children = new Map<string | null, ExplainedTask[]>();
  for (const t of tasks) {
    const ds = deps.get(t.id) ?? [];
    const parent = ds.length === 0 ? null : ds.reduce((a, b) => (levelOf(b) > levelOf(a) || (levelOf(b) === levelOf(a) && BigInt(b) > BigInt(a)) ? b : a));
    children.set(parent, [...(children.get(parent) ?? []), t]);
  }
  const out: { task: ExplainedTask; depth: number; last: boolean[] }[] = [];
  const walk = (parent: string | null, last: boolean[]) => {
    const kids = children.get(parent) ?? [];
    kids.forEach((t, i) => {
      const mine = [...last, i === kids.length - 1];
      out.push({ task: t, depth: mine.length - 1, last: mine });
      walk(t.id, mine);
    });
  };
  walk(null, []);
  return out;
}

function registerRun(program: Command, io: CliIo): void {
  withDbOptions(program.command('run'))
    .description('Show a run as a tree of its tasks, with each task\'s state and why it is there.')
    .argument('<id>', 'the run id', id('run'))
    .action(async (runId: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const run = await explainRun(pool, runId);
        if (!run) throw new CliError(`no run ${runId}`, EXIT.failed);
        const edges = await runEdges(pool, runId);
        if (opts.json) return printJson(io, { ...run, edges });
        const done = run.tasks.filter((t) => t.state !== 'pending' && t.state !== 'running').length;
        io.out(`run ${run.id} ${quoted(run.name)}: ${run.state}, ${done} of ${run.tasks.length} tasks done`);
        io.out(`  ${TASK_STATES.filter((s) => run.counts[s]).map((s) => `${s} ${run.counts[s]}`).join(', ') || 'no tasks'}`);
        if (run.error) io.out(`  error: ${run.error}`);
        for (const { task, last } of runTree(run.tasks, edges)) {
          const prefix = last.slice(0, -1).map((l) => (l ? '   ' : '│  ')).join('') + (last[last.length - 1] ? '└─ ' : '├─ ');
          io.out(`${prefix}${task.step ?? task.name} #${task.id} [${task.state}] ${task.why}`);
        }
      });
    });
}

function registerTask(program: Command, io: CliIo): void {
  withDbOptions(program.command('task'))
    .description('Show a task: its input, output, attempts and error history.')
    .argument('<id>', 'the task id', id('task'))
    .action(async (taskId: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const t = await getTask(pool, taskId);
        if (!t) throw new CliError(`no task ${taskId}`, EXIT.failed);
        if (opts.json) return printJson(io, t);
        const now = new Date();
        io.out(`task ${t.id} ${t.name}: ${t.state}`);
        io.out(`  queue ${t.queue}, priority ${t.priority}, attempts ${t.attempts} of ${t.maxAttempts}${t.interruptions > 0 ? `, ${t.interruptions} interrupted (not counted)` : ''}, timeout ${t.timeoutMs} ms`);
        if (t.progress) io.out(`  progress ${progressText(t.progress) ?? '-'} (at ${t.progress.at})`);
        if (t.waiting) io.out(`  ${t.waiting}`);
        if (t.runId) io.out(`  run ${t.runId}, step ${t.step}`);
        if (t.key) io.out(`  key ${t.key}`);
        io.out(`  created ${t.createdAt.toISOString()} (${ago(t.createdAt, now)}), run at ${t.runAt.toISOString()}`);
        if (t.startedAt) io.out(`  started ${t.startedAt.toISOString()}`);
        if (t.finishedAt) io.out(`  finished ${t.finishedAt.toISOString()}`);
        if (t.leaseOwner) io.out(`  leased by ${t.leaseOwner} until ${t.leaseExpiresAt?.toISOString()}`);
        if (t.dependsOn.length > 0) io.out(`  depends on: ${t.dependsOn.map((d) => `${d.step ?? d.id} #${d.id} [${d.state}]`).join(', ')}`);
        io.out(`input:  ${JSON.stringify(t.input)}`);
        io.out(`output: ${t.output === null ? '-' : JSON.stringify(t.output)}`);
        if (t.errors.length === 0) io.out('errors: none');
        else {
          io.out(`errors (${t.errors.length}, oldest first):`);
          for (const e of t.errors) io.out(`  attempt ${e.attempt} at ${e.at}: ${e.name}: ${e.message}`);
        }
      });
    });
}

function reportRetry(io: CliIo, opts: DbOptions, what: string, r: RetryReport): void {
  if (opts.json) printJson(io, r);
  if (!r.retried) throw new CliError(`${what} was not retried: ${r.reason ?? `it is ${r.state}`}`, EXIT.failed);
  if (!opts.json) io.out(`${what} retried: ${r.tasks} task${r.tasks === 1 ? '' : 's'} pending again`);
}

function registerRetry(program: Command, io: CliIo): void {
  const retry = program.command('retry').description('Retry a task that failed (or was cancelled), or a finished run.');
  withDbOptions(retry.command('task'))
    .description('Put a failed or cancelled task back to pending with fresh attempts (a task of a run retries its run).')
    .argument('<id>', 'the task id', id('task'))
    .action(async (taskId: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => reportRetry(io, opts, `task ${taskId}`, await retryTask(pool, taskId)));
    });
  withDbOptions(retry.command('run'))
    .description('Put a failed or cancelled run back to running, its failed, skipped and cancelled tasks pending again.')
    .argument('<id>', 'the run id', id('run'))
    .action(async (runId: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => reportRetry(io, opts, `run ${runId}`, await retryRun(pool, runId)));
    });
}

function registerCancel(program: Command, io: CliIo): void {
  const cancel = program.command('cancel').description('Cancel work that is still running.');
  withDbOptions(cancel.command('run'))
    .description('Cancel a running run: its pending and running tasks are cancelled.')
    .argument('<id>', 'the run id', id('run'))
    .action(async (runId: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const r = await cancelRun(pool, runId, { reason: 'cancelled from the command line' });
        if (opts.json) printJson(io, r);
        if (r.state === null) throw new CliError(`no run ${runId}`, EXIT.failed);
        if (!r.cancelled) throw new CliError(`run ${runId} was not cancelled: it has already ${r.state}`, EXIT.failed);
        if (!opts.json) io.out(`run ${runId} cancelled: ${r.pendingCancelled} pending and ${r.runningCancelled} running tasks cancelled`);
      });
    });
}

function registerEnqueue(program: Command, io: CliIo): void {
  withDbOptions(program.command('enqueue'))
    .description('Enqueue a task with JSON input, checked against the task\'s schema first.')
    .argument('<name>', 'the task\'s name')
    .argument('<json>', 'the input, as JSON (use - to read it from stdin)')
    .requiredOption('--tasks <module>', 'module exporting the task definitions (their schemas validate the input)')
    .option('--queue <queue>', 'queue (default: the task\'s)')
    .option('--priority <n>', 'priority (higher first)', (v) => {
      const n = Number(v);
      if (!Number.isInteger(n)) throw new InvalidArgumentError('expected a whole number');
      return n;
    })
    .option('--delay-ms <ms>', 'run no earlier than this many ms from now', wholeNumber(0))
    .option('--key <key>', 'idempotency key')
    .action(async (name: string, raw: string, opts: DbOptions & { tasks: string; queue?: string; priority?: number; delayMs?: number; key?: string }) => {
      const url = parseUrl(opts.databaseUrl);
      const text = raw === '-' ? await readStdin() : raw;
      let input: unknown;
      try {
        input = JSON.parse(text);
      } catch (err) {
        throw new CliError(`the input is not valid JSON: ${toError(err).message}`, EXIT.usage);
      }
      const loaded = await loadTasksModule(opts.tasks);
      const task = loaded.tasks.find((t) => t.name === name);
      if (!task) {
        throw new CliError(`unknown task "${name}": ${opts.tasks} defines ${loaded.tasks.map((t) => `"${t.name}"`).join(', ') || 'no tasks'}`, EXIT.usage);
      }
      // Awaited, so an asynchronous schema's issues read here too; enqueue
      // itself then refuses that schema with the fix.
      const checked = await validate(task.input, input);
      if (checked.issues) {
        const issues = formatIssues(checked.issues);
        throw new CliError(`invalid input for "${name}": ${issues}`, EXIT.usage);
      }
      await withDb({ ...opts, databaseUrl: url.toString() }, async (pool) => {
        let r;
        try {
          r = await enqueue(pool, task, input as never, { queue: opts.queue, priority: opts.priority, delayMs: opts.delayMs, key: opts.key });
        } catch (err) {
          if (err instanceof InvalidEnqueueError) throw new CliError(err.message.replace(/^outlive: /, ''), EXIT.usage);
          throw err;
        }
        if (opts.json) return printJson(io, r);
        io.out(r.deduplicated
          ? `task ${r.id} (${r.name}) already pending with key ${opts.key}: not enqueued again`
          : `enqueued task ${r.id} (${r.name}) on queue ${r.queue}, to run at ${r.runAt.toISOString()}`);
      });
    });
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function registerGrants(program: Command, io: CliIo): void {
  program
    .command('grants')
    .description(
      'Print the SQL that gives each role exactly the privileges its part needs on schema outlive; run it as the role that ran migrate ' +
        '(outlive grants ... | psql -v ON_ERROR_STOP=1 "$MIGRATOR_URL"). See docs/shared-database.md.',
    )
    .option('--app <role>', 'the role the app enqueues and starts runs as')
    .option('--worker <role>', 'the role passes run as (the worker, the drain, the cron route)')
    .option('--dashboard <role>', 'the role the dashboard and the inspecting commands run as')
    .action((opts: { app?: string; worker?: string; dashboard?: string }) => {
      if (opts.app === undefined && opts.worker === undefined && opts.dashboard === undefined) {
        throw new CliError('name at least one role: --app <role>, --worker <role>, --dashboard <role>', EXIT.usage);
      }
      let sql: string;
      try {
        sql = grants(opts);
      } catch (err) {
        if (err instanceof ConfigError) throw new CliError(err.message.replace(/^outlive: /, ''), EXIT.usage);
        throw err;
      }
      for (const line of lines(sql)) io.out(line);
    });
}

/** Registers the commands that inspect and steer the rows. */
function registerInspect(program: Command, io: CliIo): void {
  registerMigrate(program, io);
  registerGrants(program, io);
  registerStatus(program, io);
  registerTasks(program, io);
  registerRuns(program, io);
  registerRun(program, io);
  registerTask(program, io);
  registerRetry(program, io);
  registerCancel(program, io);
  registerEnqueue(program, io);
  registerLimits(program, io);
  registerLimit(program, io);
  registerQueue(program, io);
  registerWeight(program, io);
}

// ---------------------------------------------------------------------------
// Flow control (issue 26): limits, pauses and weights, read and changed at
// run time. The next claim obeys; nothing is deployed.

/** "1 task waits", "12 tasks wait", "10000+ tasks wait". */
function tasksWait(n: number, more: boolean): string {
  return more ? `${n}+ tasks wait` : n === 1 ? '1 task waits' : `${n} tasks wait`;
}

/** One line of `status` on a key tasks wait for. */
function waitLine(w: StatusReport['waits'][number]): string {
  const n = tasksWait(w.waiting, w.waitingMore);
  const s = w.state;
  if (w.waiting === 0) return `${w.wait?.text ?? `key ${w.key} has room`}: no task waits for it yet`;
  if (!w.wait) return `${n}: ${roomText(s)}`;
  if (w.wait.kind === 'concurrency') return `${n} for key ${w.key}: ${s.running} of ${s.concurrency} running`;
  if (w.wait.kind === 'rate') return `${n} for ${w.wait.text}`;
  return `${n}: ${w.wait.text}`;
}

/** A duration given on the command line, in ms: 500ms, 90s, 10m, 2h, 1d, or several together (1h30m). */
export function parseDuration(value: string): number {
  const units: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };
  const parts = [...value.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join('') !== value) {
    throw new InvalidArgumentError('expected a duration such as 500ms, 90s, 10m, 2h or 1h30m');
  }
  const ms = Math.round(parts.reduce((sum, p) => sum + Number(p[1]) * units[p[2]!]!, 0));
  if (ms <= 0) throw new InvalidArgumentError('expected a duration longer than 0');
  return ms;
}

// Commander keeps an option's parsed null as '', so `none` stays 'none' until the action.

/** --concurrency: a whole number, or `none` to clear the override. */
function concurrencyArg(value: string): number | 'none' {
  if (value === 'none') return value;
  const n = Number(value);
  if (!/^[0-9]+$/.test(value) || !Number.isInteger(n) || n < 1 || n > 1_000_000) {
    throw new InvalidArgumentError('expected a whole number from 1 to 1000000, or none to go back to what the tasks declare');
  }
  return n;
}

/** --rate: `<limit>/<period>` (60/1m, 200000/60s, 10/1500ms), or `none` to clear the override. */
function rateArg(value: string): { limit: number; periodMs: number } | 'none' {
  if (value === 'none') return value;
  const m = /^([0-9]+)\/(.+)$/.exec(value);
  const limit = m ? Number(m[1]) : NaN;
  let periodMs = NaN;
  try {
    if (m) periodMs = parseDuration(m[2]!);
  } catch {
    // Reported below, with the whole form.
  }
  if (!Number.isInteger(limit) || limit < 1 || limit > 2 ** 31 - 1 || !Number.isInteger(periodMs) || periodMs > 86_400_000) {
    throw new InvalidArgumentError('expected <limit>/<period>, a whole number of starts per period of at most a day (60/1m, 200000/60s, 10/1500ms), or none to go back to what the tasks declare');
  }
  return { limit, periodMs };
}

/** --until: an ISO 8601 time. */
function timeArg(value: string): Date {
  const at = new Date(value);
  if (!/^\d{4}-\d{2}-\d{2}/.test(value) || Number.isNaN(at.getTime())) throw new InvalidArgumentError('expected an ISO 8601 time such as 2030-01-01T12:00:00Z');
  return at;
}

/** --weight: a number > 0 and at most 1000. */
function weightArg(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 1000) throw new InvalidArgumentError('expected a number greater than 0 and at most 1000');
  return n;
}

/** Runs a flow-control call; a value it refuses is bad input (exit 2), with its message. */
async function flowCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof FlowControlError) throw new CliError(err.message.replace(/^outlive: /, ''), EXIT.usage);
    throw err;
  }
}

function concurrencyCell(s: KeyState): string {
  return s.concurrency === null ? '-' : `${s.concurrency}${s.concurrencySet ? ' (set)' : ''}`;
}

function rateCell(s: KeyState): string {
  return s.rate === null ? '-' : `${s.rate.limit} per ${formatPeriod(s.rate.periodMs)}${s.rate.burst === undefined ? '' : `, burst ${s.rate.burst}`}${s.rateSet ? ' (set)' : ''}`;
}

function windowCell(s: KeyState, now: Date): string {
  if (s.rate === null || s.windowUsed === null) return '-';
  const used = `${Math.round(s.windowUsed * 1000) / 1000} of ${s.rate.limit}`;
  const wait = keyWait({ ...s, pause: null, concurrency: null });
  if (!wait) return used;
  return s.nextStartAt ? `${used}, next start in ${duration(s.nextStartAt.getTime() - now.getTime())}` : `${used}, full`;
}

function pauseCell(s: KeyState, now: Date): string {
  if (!s.pause) return '-';
  const by = s.pause.by === 'rate-limited' ? ' (429)' : s.pause.by === 'hand' ? ' (by hand)' : '';
  const until = s.pause.until ? `${duration(s.pause.until.getTime() - now.getTime())} more` : 'until resumed';
  return `${until}${by}${s.pause.reason && s.pause.reason !== 'paused by hand' ? `: ${s.pause.reason}` : ''}`;
}

/** One line on where a key stands, after a change. */
function keyLine(s: KeyState): string {
  const parts = [
    `${s.running} running`,
    s.concurrency === null ? 'no concurrency limit' : `concurrency ${concurrencyCell(s)}`,
    s.rate === null ? 'no rate' : `rate ${rateCell(s)}${s.windowUsed === null ? '' : `, ${Math.round(s.windowUsed * 1000) / 1000} used in the window`}`,
    s.pause ? pauseText(s.key, s.pause).slice(`key ${s.key} `.length) : 'not paused',
    tasksWait(s.waiting, s.waitingMore),
  ];
  return `key ${s.key}: ${parts.join('; ')}`;
}

function registerLimits(program: Command, io: CliIo): void {
  withDbOptions(program.command('limits'))
    .description('Flow control at a glance: each key\'s running tasks and concurrency, its rate and how much of the window is used, its pause, the tasks waiting for it; and the paused queues.')
    .argument('[keys...]', 'only these keys')
    .option('--limit <n>', 'at most this many keys (those paused, with tasks waiting or running first)', wholeNumber(1), 100)
    .action(async (keys: string[], opts: DbOptions & { limit: number }) => {
      await withDb(opts, async (pool) => {
        const [{ keys: states, total }, queues, [clock]] = await Promise.all([
          listKeys(pool, { keys: keys.length > 0 ? keys : undefined, limit: opts.limit }),
          pausedQueues(pool),
          pool.query<{ now: Date }>('SELECT pg_catalog.now() AS now').then((r) => r.rows),
        ]);
        if (opts.json) return printJson(io, { keys: states, total, pausedQueues: queues });
        const now = clock!.now;
        if (states.length === 0) {
          io.out(keys.length > 0 ? 'no such keys' : 'no keys yet: a key appears when a claim first looks at a task that declares it, or when it is set or paused');
        } else {
          for (const l of table(
            ['key', 'running', 'concurrency', 'rate', 'window', 'paused', 'waiting'],
            states.map((s) => [s.key, s.running, concurrencyCell(s), rateCell(s), windowCell(s, now), pauseCell(s, now), s.waitingMore ? `${s.waiting}+` : s.waiting]),
          )) io.out(l);
          if (total > states.length) io.out(`${states.length} of ${total} keys shown (paused, waiting and running first): name keys, or raise --limit`);
        }
        if (queues.length > 0) io.out('');
        for (const q of queues) io.out(`queue ${q.queue} is paused: ${q.reason ?? 'no reason given'} (since ${q.pausedAt.toISOString()})`);
      });
    });
}

function registerLimit(program: Command, io: CliIo): void {
  const limit = program.command('limit').description('Change a key\'s limits, or pause it, at run time: the next claim obeys.');
  withDbOptions(limit.command('set'))
    .description('Override what tasks declare for a key (none: back to what they declare).')
    .argument('<key>', 'the limit key')
    .option('--concurrency <n|none>', 'at most this many of its tasks running at once', concurrencyArg)
    .option('--rate <limit/period|none>', 'at most <limit> starts (or units of cost) in any window of <period>: 60/1m, 200000/60s, 10/1500ms', rateArg)
    .action(async (key: string, opts: DbOptions & { concurrency?: number | 'none'; rate?: { limit: number; periodMs: number } | 'none' }) => {
      if (opts.concurrency === undefined && opts.rate === undefined) {
        throw new CliError('say what to set: --concurrency <n|none> and/or --rate <limit>/<period>|none', EXIT.usage);
      }
      const override: LimitOverride = {};
      if (opts.concurrency !== undefined) override.concurrency = opts.concurrency === 'none' ? null : opts.concurrency;
      if (opts.rate !== undefined) override.rate = opts.rate === 'none' ? null : opts.rate;
      await withDb(opts, async (pool) => {
        await flowCall(() => setLimit(pool, key, override));
        const [s] = await keyStates(pool, [key]);
        if (opts.json) return printJson(io, s);
        io.out(keyLine(s!));
      });
    });
  withDbOptions(limit.command('pause'))
    .description('Pause a key: none of its tasks starts until the time given, or until resumed. Running tasks run on.')
    .argument('<key>', 'the limit key')
    .addOption(new Option('--until <time>', 'until this ISO 8601 time').argParser(timeArg).conflicts('for'))
    .addOption(new Option('--for <duration>', 'for this long: 90s, 10m, 2h').argParser(parseDuration))
    .option('--reason <text>', 'why, shown by status, limits and the dashboard')
    .action(async (key: string, opts: DbOptions & { until?: Date; for?: number; reason?: string }) => {
      const until = opts.until ?? (opts.for !== undefined ? new Date(Date.now() + opts.for) : undefined);
      if (until && until.getTime() <= Date.now()) throw new CliError(`--until ${until.toISOString()} is in the past`, EXIT.usage);
      await withDb(opts, async (pool) => {
        await flowCall(() => pauseKey(pool, key, { until, reason: opts.reason }));
        const [s] = await keyStates(pool, [key]);
        if (opts.json) return printJson(io, s);
        // Paused here, so by hand, whatever its reason says.
        io.out(s!.pause ? pauseText(key, { ...s!.pause, by: 'hand' }) : `key ${key} paused`);
      });
    });
  withDbOptions(limit.command('resume'))
    .description('Resume a paused key, whether paused by hand or by a 429.')
    .argument('<key>', 'the limit key')
    .action(async (key: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const [before] = await flowCall(() => keyStates(pool, [key]));
        if (!before!.known) throw new CliError(`no key ${key}: no claim has looked at a task of it, and it was never set or paused`, EXIT.failed);
        if (!before!.pause) throw new CliError(`key ${key} was not resumed: it is not paused`, EXIT.failed);
        await flowCall(() => resumeKey(pool, key));
        if (opts.json) return printJson(io, { key, resumed: true, was: before!.pause });
        io.out(`key ${key} resumed: ${tasksWait(before!.waiting, before!.waitingMore)} for it, which the next pass may start`);
      });
    });
}

function registerQueue(program: Command, io: CliIo): void {
  const queue = program.command('queue').description('Pause or resume a queue: no pass claims a paused queue\'s tasks.');
  withDbOptions(queue.command('pause'))
    .description('Pause a queue: no pass claims its tasks until it is resumed. Running tasks run on.')
    .argument('<queue>', 'the queue')
    .option('--reason <text>', 'why, shown by status, limits and the dashboard')
    .action(async (name: string, opts: DbOptions & { reason?: string }) => {
      await withDb(opts, async (pool) => {
        await flowCall(() => pauseQueue(pool, name, { reason: opts.reason }));
        if (opts.json) return printJson(io, { queue: name, paused: true, reason: opts.reason ?? 'paused by hand' });
        io.out(`queue ${name} paused: no pass claims its tasks until \`outlive queue resume ${name}\``);
      });
    });
  withDbOptions(queue.command('resume'))
    .description('Resume a paused queue.')
    .argument('<queue>', 'the queue')
    .action(async (name: string, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        const resumed = await flowCall(() => resumeQueue(pool, name));
        if (opts.json) printJson(io, { queue: name, resumed });
        if (!resumed) throw new CliError(`queue ${name} was not resumed: it is not paused`, EXIT.failed);
        if (!opts.json) io.out(`queue ${name} resumed: its tasks are claimed again`);
      });
    });
}

function registerWeight(program: Command, io: CliIo): void {
  withDbOptions(program.command('weight'))
    .description('Set a fairness key\'s weight in a queue: with weights 3 and 1, two keys with ready tasks are served three turns to one (default 1; for tasks placed from now on).')
    .argument('<queue>', 'the queue')
    .argument('<key>', 'the fairness key')
    .argument('<weight>', 'a number > 0 and <= 1000', weightArg)
    .action(async (name: string, key: string, weight: number, opts: DbOptions) => {
      await withDb(opts, async (pool) => {
        await flowCall(() => setWeight(pool, name, key, weight));
        if (opts.json) return printJson(io, { queue: name, key, weight });
        io.out(`key ${key} weighs ${weight} in queue ${name}: its tasks placed from now on take ${weight} turn${weight === 1 ? '' : 's'} to a weight-1 key's 1`);
      });
    });
}
