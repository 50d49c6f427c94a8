/**
 * A real Next.js app-router app, `examples/next/`, built by `next build`
 * (Turbopack, Next's default) against the packed tarball as a new user
 * installs it, then served by `next start` against the test database, a
 * plain Postgres URL with no proxy, and called as Vercel and a browser would:
 * a signup that enqueues in its transaction and nudges the drain, the cron
 * route, the dashboard and its subpages.
 *
 * The build is kept per tarball, example and Node version (in the system's
 * temporary folder), so the suite's runs against other databases in one CI
 * run serve the same build instead of making it again.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { freshDb } from './support/db.js';
import { freePort } from './support/postgres.js';
import { roleUrl, waitFor } from './support/functions-db.js';
import { packedTarball, ROOT } from './support/packed.js';
import { taskRow } from './support/tasks.js';

const run = promisify(execFile);
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const EXAMPLE = path.join(ROOT, 'examples/next');

function filesOf(dir: string, base = dir): string[] {
  return readdirSync(dir)
    .filter((name) => !['node_modules', '.next', 'next-env.d.ts', 'tsconfig.tsbuildinfo'].includes(name))
    .sort()
    .flatMap((name) => {
      const full = path.join(dir, name);
      return statSync(full).isDirectory() ? filesOf(full, base) : [path.relative(base, full)];
    });
}

/** The example installed from `tarball` and built, made once per tarball, example and Node version. */
async function builtApp(tarball: string): Promise<string> {
  const hash = createHash('sha256').update(readFileSync(tarball)).update(process.version);
  for (const file of filesOf(EXAMPLE)) hash.update(file).update(readFileSync(path.join(EXAMPLE, file)));
  const dir = path.join(tmpdir(), `outlive-next-${hash.digest('hex').slice(0, 16)}`);
  const app = path.join(dir, 'app');
  const lock = `${dir}.lock`;
  for (const deadline = Date.now() + 600_000; ; ) {
    if (existsSync(path.join(dir, 'built'))) return app;
    try {
      mkdirSync(lock);
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`${lock} held for 10 minutes; remove it if no test is running`);
      await new Promise((r) => setTimeout(r, 1_000));
    }
  }
  try {
    rmSync(dir, { recursive: true, force: true });
    cpSync(EXAMPLE, app, { recursive: true, filter: (src) => !/[\\/](node_modules|\.next)([\\/]|$)/.test(src) });
    // As the README says to install it until the package is published: from the tarball.
    const pkg = JSON.parse(readFileSync(path.join(app, 'package.json'), 'utf8'));
    pkg.dependencies.outlive = `file:${tarball}`;
    writeFileSync(path.join(app, 'package.json'), JSON.stringify(pkg, null, 2));
    await run(npm, ['install', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: app, timeout: 600_000 });
    await run(process.execPath, [path.join(app, 'node_modules/next/dist/bin/next'), 'build'], {
      cwd: app,
      timeout: 600_000,
      env: { ...process.env, NEXT_TELEMETRY_DISABLED: '1', NODE_ENV: 'production' },
    }).catch((err: { stdout?: string; stderr?: string }) => {
      throw new Error(`next build failed:\n${err.stdout ?? ''}\n${err.stderr ?? ''}`);
    });
    writeFileSync(path.join(dir, 'built'), '');
    return app;
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

const db = await freshDb();
await db.pool.query(`CREATE TABLE users (id serial PRIMARY KEY, email text NOT NULL)`);
const { url: databaseUrl, password } = await roleUrl(db);
const SECRET = 'd'.repeat(8) + crypto.randomUUID().replace(/-/g, '');
const CRON_SECRET = `cron-${crypto.randomUUID()}`;
const TOKEN = `token-${crypto.randomUUID()}`;
let server: ChildProcess | undefined;
let output = '';
let base = '';

afterAll(async () => {
  if (server && server.exitCode === null) {
    const exited = new Promise((resolve) => server!.once('exit', resolve));
    server.kill('SIGTERM');
    await exited;
  }
});

describe('a Next.js app-router app built with the packed package (examples/next)', { timeout: 900_000 }, () => {
  it('builds with next build (Turbopack) and starts against a plain Postgres URL', async () => {
    const app = await builtApp(await packedTarball());
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    server = spawn(process.execPath, [path.join(app, 'node_modules/next/dist/bin/next'), 'start', '-p', String(port), '-H', '127.0.0.1'], {
      cwd: app,
      env: {
        ...process.env,
        NEXT_TELEMETRY_DISABLED: '1',
        NODE_ENV: 'production',
        DATABASE_URL: databaseUrl,
        OUTLIVE_DRAIN_SECRET: SECRET,
        // Self-hosted (next start): the drain's URL is configured, never read from the Host header.
        OUTLIVE_DRAIN_URL: `${base}/api/drain`,
        CRON_SECRET,
        OUTLIVE_DASHBOARD_TOKEN: TOKEN,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    server.stdout!.on('data', (chunk: Buffer) => (output += String(chunk)));
    server.stderr!.on('data', (chunk: Buffer) => (output += String(chunk)));
    await waitFor(
      async () => {
        if (server!.exitCode !== null) throw new Error(`next start exited:\n${output}`);
        return fetch(`${base}/api/cron`).then((r) => r.status === 401, () => false);
      },
      60_000,
      'next start to answer',
    );
  });

  it('enqueues in the business transaction, nudges after the response, and the drain runs the task', async () => {
    const res = await fetch(`${base}/api/signup`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ email: 'ada@example.com' }) });
    expect(res.status, output).toBe(201);
    const { taskId } = (await res.json()) as { taskId: string };
    const row = await waitFor(async () => {
      const r = await taskRow(db.pool, taskId);
      return r.state === 'succeeded' ? r : undefined;
    }, 30_000, `the task to run\n${output}`);
    expect(row).toMatchObject({ name: 'send-welcome', attempts: 1, output: { sent: 'ada@example.com' } });
    // The pass logs its report when it ends, a moment after its settle.
    await waitFor(async () => /"outlive":"pass","platform":"vercel","trigger":"drain","driver":"pg"/.test(output), 10_000, `the drain's pass to be logged\n${output}`);
  });

  it('answers the cron with its report, with the secret, and 401 without it', async () => {
    expect((await fetch(`${base}/api/cron`)).status).toBe(401);
    const res = await fetch(`${base}/api/cron`, { headers: { authorization: `Bearer ${CRON_SECRET}` } });
    expect(res.status, output).toBe(200);
    expect(await res.json()).toMatchObject({ report: { failed: 0, stoppedBy: 'drained' } });
  });

  it('serves the dashboard and its subpages behind the token', async () => {
    expect((await fetch(`${base}/api/dashboard`)).status).toBe(401);
    const login = await fetch(`${base}/api/dashboard?token=${TOKEN}`, { redirect: 'manual' });
    expect(login.status).toBe(303);
    const cookie = login.headers.get('set-cookie')!.split(';')[0]!;
    const overview = await fetch(`${base}/api/dashboard`, { headers: { cookie } });
    expect(overview.status).toBe(200);
    expect(await overview.text()).toContain('<h1>Overview</h1>');
    const { id } = (await db.rows<{ id: string }>(`SELECT id::text FROM outlive.tasks ORDER BY id LIMIT 1`))[0]!;
    const page = await fetch(`${base}/api/dashboard/tasks/${id}`, { headers: { cookie } });
    expect(page.status, await page.clone().text()).toBe(200);
    const task = await page.text();
    expect(task).toContain('send-welcome');
    expect(task).toContain('ada@example.com');
  });

  it('never prints a secret', () => {
    for (const secret of [SECRET, CRON_SECRET, TOKEN, password, databaseUrl]) expect(output.includes(secret)).toBe(false);
  });
});
