/**
 * `npm start`, the README's first command: the local stack in one process
 * (scripts/start.ts), here on the test database instead of an embedded one.
 * Its Worker runs in Miniflare on a Hyperdrive binding to that database, as
 * `wrangler dev` does with `localConnectionString`: no proxy. It must start,
 * run its site import to the end through the drain and the cron, serve the
 * dashboard behind its token, and stop on Ctrl-C leaving no process behind.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freshDb } from './support/db.js';
import { freePort } from './support/postgres.js';
import { waitFor } from './support/functions-db.js';
import { ROOT } from './support/packed.js';

/** Pids of the processes whose parent is `pid`, from /proc. */
async function childrenOf(pid: number): Promise<number[]> {
  const { readdirSync, readFileSync } = await import('node:fs');
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

const db = await freshDb();
const TOKEN = `local-${crypto.randomUUID()}`;
const port = await freePort();
let output = '';
const child = spawn(process.execPath, ['--conditions=outlive-source', '--import', 'tsx', path.join(ROOT, 'scripts/start.ts')], {
  cwd: ROOT,
  env: { ...process.env, DATABASE_URL: db.directUrl, PORT: String(port), OUTLIVE_CRON_SECONDS: '1', OUTLIVE_DEMO_PAGES: '6', OUTLIVE_DASHBOARD_TOKEN: TOKEN },
  stdio: ['ignore', 'pipe', 'pipe'],
});
child.stdout.on('data', (chunk: Buffer) => (output += String(chunk)));
child.stderr.on('data', (chunk: Buffer) => (output += String(chunk)));
// 'close', not 'exit': the last lines it printed arrive after it exits.
const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));

afterAll(async () => {
  if (child.exitCode === null) {
    child.kill('SIGKILL');
    await exited;
  }
});

describe('npm start (scripts/start.ts)', { timeout: 120_000 }, () => {
  it('starts the Worker on a Hyperdrive binding, and prints the dashboard and the CLI', async () => {
    await waitFor(async () => {
      if (child.exitCode !== null) throw new Error(`npm start exited:\n${output}`);
      return output.includes('running; Ctrl-C to stop');
    }, 90_000, `the stack to start\n${output}`);
    expect(output).toContain(`Dashboard: http://127.0.0.1:${port}/dashboard/?token=`);
    expect(output).toMatch(/drain webhook nudged: accepted/);
  });

  it('runs the site import to the end through the drain and the cron, with node-postgres', async () => {
    await waitFor(async () => {
      const [run] = await db.rows<{ state: string }>(`SELECT state::text FROM outlive.runs ORDER BY id LIMIT 1`);
      return run?.state === 'succeeded';
    }, 90_000, `the site import to finish\n${output}`);
    expect(await db.rows(`SELECT pages FROM site_imports`)).toEqual([{ pages: 6 }]);
    expect(output).toMatch(/"outlive":"pass","platform":"cloudflare","trigger":"drain","driver":"pg"/);
    expect(output).toMatch(/"outlive":"pass","platform":"cloudflare","trigger":"cron","driver":"pg"/);
  });

  it('serves the dashboard behind its token', async () => {
    expect((await fetch(`http://127.0.0.1:${port}/dashboard/`)).status).toBe(401);
    const page = await fetch(`http://127.0.0.1:${port}/dashboard/`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('<h1>Overview</h1>');
  });

  it('stops on Ctrl-C, leaving no process behind', async () => {
    const before = await childrenOf(child.pid!);
    expect(before.length).toBeGreaterThan(0); // workerd, at least
    child.kill('SIGINT');
    expect(await exited).toBe(130);
    expect(output).toContain('outlive: SIGINT: stopping');
    // A process that has exited but is not yet reaped still answers kill 0:
    // read its state, and give the reaping a moment.
    const alive = async (pid: number) => {
      const { readFileSync } = await import('node:fs');
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z' ? `${pid}: ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ')}` : false;
      } catch {
        return false;
      }
    };
    const left = async () => (await Promise.all(before.map(alive))).filter(Boolean);
    await waitFor(async () => (await left()).length === 0, 10_000, 'its processes to end').catch(() => undefined);
    expect(await left()).toEqual([]);
  });
});
