/**
 * Measures the dashboard at scale: the server CPU (process.cpuUsage around
 * the handler and reading its body) and the bytes of each page, for runs of
 * 10,000 and 100,000 steps (a wide fan-in and a long chain) and for 100,000
 * and 1,000,000 tasks. Rows are written with SQL (scripts/local/rows-at-scale.ts).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres node --import tsx scripts/dashboard-cpu.ts [--small]
 *
 * `--small` measures 10,000-step runs and 100,000 tasks only. It creates
 * scratch databases beside DATABASE_URL's and drops them after.
 */
import pg from 'pg';
import { migrate } from '../src/node/index.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { scratchDatabase } from './local/scratch-db.js';
import { insertRun, insertTasks } from './local/rows-at-scale.js';

const TOKEN = 'measure-dashboard-token-0123456789';

/** One page's cost: the median of `times` requests (after one to warm up), and its bytes; and a repeat with If-None-Match. */
interface Measured {
  cpuMs: number;
  wallMs: number;
  bytes: number;
  status: number;
  /** The status of a repeat with the first answer's ETag, and its wall time. */
  again: number;
  againMs: number;
}

async function measure(pool: pg.Pool, path: string, times = 5): Promise<Measured> {
  const url = `http://dashboard.test/dashboard${path}${path.includes('?') ? '&' : '?'}refresh=0`;
  const get = async (headers: Record<string, string> = {}) => {
    const start = process.cpuUsage();
    const t0 = performance.now();
    const res = await handleDashboard(new Request(url, { headers: { authorization: `Bearer ${TOKEN}`, ...headers } }), pool, { token: TOKEN });
    const body = await res.text();
    const used = process.cpuUsage(start);
    return { cpuMs: (used.user + used.system) / 1000, wallMs: performance.now() - t0, bytes: Buffer.byteLength(body), status: res.status, etag: res.headers.get('etag') };
  };
  const first = await get();
  const runs = [];
  for (let i = 0; i < times; i++) runs.push(await get());
  runs.sort((a, b) => a.cpuMs - b.cpuMs);
  const mid = runs[Math.floor(runs.length / 2)]!;
  const again = first.etag ? await get({ 'if-none-match': first.etag }) : null;
  const wallMs = runs.map((r) => r.wallMs).sort((a, b) => a - b)[Math.floor(runs.length / 2)]!;
  return { cpuMs: mid.cpuMs, wallMs, bytes: mid.bytes, status: mid.status, again: again?.status ?? 0, againMs: again?.wallMs ?? 0 };
}

function row(label: string, m: Measured): string {
  return `| ${label} | ${m.cpuMs.toFixed(1)} | ${m.wallMs.toFixed(1)} | ${(m.bytes / 1024).toFixed(1)} KB | ${m.status}${m.again ? `, then ${m.again} in ${m.againMs.toFixed(1)} ms` : ''} |`;
}

async function withDatabase<T>(prefix: string, body: (pool: pg.Pool) => Promise<T>): Promise<T> {
  const scratch = await scratchDatabase(prefix);
  const pool = new pg.Pool({ connectionString: scratch.url, max: 4 });
  // The scratch database's drop ends idle connections; that is not a failure.
  pool.on('error', () => {});
  try {
    await migrate(pool);
    return await body(pool);
  } finally {
    await pool.end();
    await scratch.drop();
  }
}

async function main(): Promise<void> {
  const small = process.argv.includes('--small');
  const lines: string[] = ['| page | server CPU, ms (median of 5) | wall, ms (with Postgres) | bytes | status (then with If-None-Match, wall) |', '|---|---|---|---|---|'];
  const runPages: Record<string, number> = {};
  for (const steps of small ? [10_000] : [10_000, 100_000]) {
    await withDatabase('outlive_dash_run', async (pool) => {
      for (const shape of ['fan-in', 'chain'] as const) {
        const id = await insertRun(pool, steps, shape);
        const m = await measure(pool, `/runs/${id}`);
        runPages[`${shape} ${steps}`] = m.cpuMs;
        lines.push(row(`run page, ${shape} of ${steps.toLocaleString('en-US')} steps`, m));
        lines.push(row(`run page, ${shape} of ${steps.toLocaleString('en-US')}, steps searched ("${shape === 'fan-in' ? 'page:99' : 'step-99'}")`, await measure(pool, `/runs/${id}?step=${shape === 'fan-in' ? 'page:99' : 'step-99'}`)));
      }
    });
  }
  for (const tasks of small ? [100_000] : [100_000, 1_000_000]) {
    await withDatabase('outlive_dash_tasks', async (pool) => {
      await insertTasks(pool, tasks);
      const n = tasks.toLocaleString('en-US');
      for (const [label, path] of [
        ['overview', '/'],
        ['tasks, newest', '/tasks'],
        ['tasks, failed', '/tasks?state=failed'],
        ['tasks, name task-3 and queue mail', '/tasks?name=task-3&queue=mail'],
        ['tasks, error text "503 for row 99"', '/tasks?q=503+for+row+99'],
        ['tasks, pending in queue imports', '/tasks?state=pending&queue=imports'],
        ['runs', '/runs'],
        ['queues', '/queues'],
        ['bulk retry of failed, confirmation', '/bulk?action=retry&state=failed'],
      ] as const) {
        lines.push(row(`${label}, ${n} tasks`, await measure(pool, path)));
      }
    });
  }
  console.log(lines.join('\n'));
  if (!small) {
    console.log(`\nratio 100k/10k: fan-in ${(runPages['fan-in 100000']! / runPages['fan-in 10000']!).toFixed(2)}, chain ${(runPages['chain 100000']! / runPages['chain 10000']!).toFixed(2)}`);
  }
}

await main();
