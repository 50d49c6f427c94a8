/**
 * A real PgBouncer in transaction mode in front of the test server, as a
 * managed Postgres's pooled connection string puts one (Neon's pooler is
 * PgBouncer in transaction mode). The suite runs through it when
 * `TEST_POOLER=pgbouncer` (CI does, with Debian's PgBouncer 1.18, which keeps
 * no prepared statements across transactions); admin statements (CREATE and
 * DROP DATABASE) still go direct.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { freePort } from './postgres.js';

/** A running PgBouncer and how to stop it. */
export interface RunningPooler {
  /** `url` with its host and port replaced by the pooler's. */
  pooled(url: string): string;
  /** PgBouncer's own version line, for the suite's banner. */
  version: string;
  stop(): Promise<void>;
}

const CANDIDATES = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];

function reachable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port }, () => {
      socket.end();
      resolve(true);
    });
    socket.on('error', () => resolve(false));
  });
}

/**
 * Starts PgBouncer (`pool_mode = transaction`, every database of `serverUrl`'s
 * server reachable through it) and waits until it accepts connections.
 * PgBouncer refuses to run as root, so as root it switches to the `postgres` user.
 */
export async function startPgBouncer(serverUrl: string, log: (line: string) => void = () => undefined): Promise<RunningPooler> {
  const binary = process.env.PGBOUNCER ?? CANDIDATES.find((c) => existsSync(c));
  if (!binary) {
    throw new Error('TEST_POOLER=pgbouncer, but no pgbouncer binary was found: install Debian\'s package (apt-get install pgbouncer) or set PGBOUNCER to its path');
  }
  const server = new URL(serverUrl);
  const port = await freePort();
  const dir = mkdtempSync(path.join(tmpdir(), 'outlive-pgbouncer-'));
  chmodSync(dir, 0o777);
  const password = decodeURIComponent(server.password);
  // `auth_type = any` takes any client as the user the [databases] line names,
  // so the tests' URLs need no userlist; the wildcard serves every database
  // the tests create.
  const target = [`host=${server.hostname}`, `port=${server.port || 5432}`, `user=${decodeURIComponent(server.username) || 'postgres'}`];
  if (password) target.push(`password=${password}`);
  const config = path.join(dir, 'pgbouncer.ini');
  writeFileSync(
    config,
    [
      '[databases]',
      `* = ${target.join(' ')}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = any',
      'pool_mode = transaction',
      'max_client_conn = 2000',
      // PostgreSQL 15 here allows 100 connections; two test files at once
      // stay under it, with room for the direct admin connections.
      'default_pool_size = 30',
      'server_idle_timeout = 5',
      'ignore_startup_parameters = extra_float_digits,options',
      '',
    ].join('\n'),
  );
  chmodSync(config, 0o644);
  const args = process.getuid?.() === 0 ? ['-u', 'postgres', config] : [config];
  const child: ChildProcess = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const collect = (chunk: Buffer) => {
    output += chunk.toString();
    for (const line of chunk.toString().split('\n')) if (line) log(line);
  };
  child.stdout?.on('data', collect);
  child.stderr?.on('data', collect);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const deadline = Date.now() + 10_000;
  while (!(await reachable(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`pgbouncer did not start:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const version = await new Promise<string>((resolve) => {
    const v = spawn(binary, ['--version']);
    let text = '';
    v.stdout.on('data', (c: Buffer) => (text += c.toString()));
    v.on('exit', () => resolve(text.split('\n')[0]?.trim() ?? 'PgBouncer'));
  });
  return {
    version,
    pooled(url: string) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    async stop() {
      child.kill('SIGINT');
      const timer = setTimeout(() => child.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
