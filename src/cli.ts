/**
 * The `outlive` command line. One command so far:
 *
 *   outlive worker --database-url URL --tasks ./dist/tasks.js
 *
 * Each command is one `register*` function adding itself to the program, so
 * later commands (migrate, enqueue, inspect) slot in beside it. Failures print
 * one line, `outlive: what went wrong`, and exit 1; no stack traces.
 */
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { ConfigError, toError } from './errors.js';
import { isSchedule, type AnySchedule } from './schedule.js';
import type { AnyTask } from './task.js';
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

/** An error the CLI reports as one line and exit code 1. */
class CliError extends Error {}

function wholeNumber(min: number) {
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
    typeof v.input?.safeParse === 'function' && typeof v.timeoutMs === 'number'
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
    .requiredOption('--tasks <module>', 'module exporting the tasks (and schedules) to run')
    .option('--concurrency <n>', 'handlers running at once', wholeNumber(1), 10)
    .option('--queues <names>', 'only these queues, comma-separated')
    .option('--poll-interval-ms <ms>', 'longest gap between passes without a notification', wholeNumber(1), 2_000)
    .option('--grace-ms <ms>', 'on SIGTERM/SIGINT, how long running tasks may finish before they are aborted', wholeNumber(0), 30_000)
    .option('--no-retention', 'do not delete old finished tasks and runs')
    .action(async (opts: {
      databaseUrl?: string;
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

/** Builds the program with every command registered. */
export function createProgram(io: CliIo = processIo, signals: SignalSource = process, setExit: (code: number) => void = () => undefined): Command {
  const program = new Command('outlive')
    .description('Durable jobs and DAG runs for serverless TypeScript, kept in Postgres rows.')
    .exitOverride()
    .configureOutput({
      writeOut: (s) => io.out(s.replace(/\n$/, '')),
      writeErr: (s) => io.err(s.replace(/\n$/, '')),
      outputError: (s, write) => write(s.replace(/^error: /, 'outlive: ')),
    })
    .showSuggestionAfterError();
  registerWorker(program, io, signals, setExit);
  return program;
}

/**
 * Runs the CLI with the user's arguments (`process.argv.slice(2)`); resolves
 * with the exit code. Every failure is reported as one line.
 */
export async function main(args: readonly string[], io: CliIo = processIo, signals: SignalSource = process): Promise<number> {
  let code = 0;
  const program = createProgram(io, signals, (c) => (code = c));
  if (args.length === 0) {
    program.outputHelp();
    return 1;
  }
  try {
    await program.parseAsync([...args], { from: 'user' });
    return code;
  } catch (err) {
    // Commander already printed its own message (unknown option, missing argument, --help).
    if (err instanceof CommanderError) return err.exitCode;
    const e = toError(err);
    const known = e instanceof CliError || e instanceof ConfigError;
    const message = e.message.replace(/^outlive: /, '').split('\n')[0];
    io.err(`outlive: ${known ? message : `${e.name}: ${message}`}`);
    return 1;
  }
}
