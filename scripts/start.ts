/**
 * `npm start`: the whole of outlive locally, in one command, no setup.
 *
 * - PostgreSQL: embedded, data kept in .data/pg (or the one at DATABASE_URL);
 *   migrations applied.
 * - The Cloudflare Worker (functions/cloudflare.ts, with scripts/local/tasks.ts
 *   as its tasks) in Miniflare, that is in workerd, reaching PostgreSQL with
 *   node-postgres through a Hyperdrive binding, as `wrangler dev` does with
 *   `localConnectionString`: no proxy. Its cron trigger fires every
 *   OUTLIVE_CRON_SECONDS (default 5) and its signed drain webhook is live.
 * - The dashboard, the Worker's `/dashboard` route, behind a token (from
 *   OUTLIVE_DASHBOARD_TOKEN, or made once and kept in .data/dashboard-token).
 * - A small local site, and a run of the site-import example against it
 *   (crawl, one task per page, some pages flaky, then a final step), started
 *   with a nudge of the drain webhook; plus one import of a missing page, which
 *   fails for good, so the failures list and its retry button have something.
 *
 * Ctrl-C stops everything (workerd, PostgreSQL) and leaves no process behind.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { Miniflare } from 'miniflare';
// A backend reset under the Worker's Hyperdrive binding must not end the stack.
import '../test/support/miniflare-sockets.js';
import pg from 'pg';
import { enqueue, nudge } from '../src/index.js';
import { migrate } from '../src/node/index.js';
import { importSite, SITE_IMPORT_TABLES, siteImportTasks } from '../examples/site-import.js';
import { startPostgres, type RunningPostgres } from '../test/support/postgres.js';
import { startSite, type LocalSite } from '../test/support/site.js';
import { COMPATIBILITY_DATE } from '../test/support/worker.js';
import { bundleLocalWorker } from './local/bundle.js';

const PORT = Number(process.env.PORT ?? 8787);
const CRON_SECONDS = Number(process.env.OUTLIVE_CRON_SECONDS ?? 5);
const PAGES = Number(process.env.OUTLIVE_DEMO_PAGES ?? 24);
const say = (line: string) => console.log(`outlive: ${line}`);

/** The dashboard's token: from the environment, or made once and kept beside the data. */
function dashboardToken(): string {
  if (process.env.OUTLIVE_DASHBOARD_TOKEN) return process.env.OUTLIVE_DASHBOARD_TOKEN;
  const file = '.data/dashboard-token';
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  mkdirSync('.data', { recursive: true });
  const token = randomBytes(24).toString('base64url');
  writeFileSync(file, token + '\n', { mode: 0o600 });
  return token;
}

async function main() {
  const cleanups: (() => Promise<unknown>)[] = [];
  let stopping: Promise<void> | null = null;
  const stop = () =>
    (stopping ??= (async () => {
      for (const cleanup of cleanups.reverse()) await cleanup().catch((err: unknown) => console.error(`outlive: while stopping: ${String(err)}`));
    })());
  const onSignal = (signal: NodeJS.Signals, code: number) => () => {
    say(`${signal}: stopping`);
    void stop().then(() => {
      say('stopped');
      process.exit(code);
    });
  };
  process.once('SIGINT', onSignal('SIGINT', 130));
  process.once('SIGTERM', onSignal('SIGTERM', 143));

  try {
    const server: RunningPostgres = await startPostgres({ url: process.env.DATABASE_URL, dataDir: '.data/pg', persistent: true });
    cleanups.push(() => server.stop());
    say(`PostgreSQL: ${server.embedded ? 'embedded, data in .data/pg' : 'DATABASE_URL'}`);
    if (stopping) return;
    await migrate(server.url);
    say('migrations applied');
    const pool = new pg.Pool({ connectionString: server.url, max: 4 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end());
    await pool.query(SITE_IMPORT_TABLES);

    const site: LocalSite = await startSite({ pages: PAGES, failures: { '/page/3': 2, '/page/11': 1, '/page/17': 3 }, delayMs: 300 });
    cleanups.push(() => site.close());

    const drainSecret = randomBytes(32).toString('hex');
    const token = dashboardToken();
    // Hyperdrive, like wrangler's localConnectionString, wants a password in
    // the URL; a server that trusts local connections ignores it.
    const hyperdrive = new URL(server.url);
    if (!hyperdrive.password) hyperdrive.password = 'local';
    const mf = new Miniflare({
      modules: true,
      script: await bundleLocalWorker(),
      compatibilityDate: COMPATIBILITY_DATE,
      compatibilityFlags: ['nodejs_compat'],
      host: '127.0.0.1',
      port: PORT,
      hyperdrives: { HYPERDRIVE: hyperdrive.toString() },
      bindings: {
        OUTLIVE_DRAIN_SECRET: drainSecret,
        OUTLIVE_DASHBOARD_TOKEN: token,
      },
    });
    cleanups.push(() => mf.dispose());
    const base = await mf.ready;
    say(`Worker (workerd via Miniflare) on ${base.origin}: POST /drain (signed), /dashboard`);

    // The cron trigger, as Cloudflare would fire it, every few seconds; one at a time.
    const worker = (await mf.getWorker()) as unknown as { scheduled(o: { cron: string; scheduledTime: Date }): Promise<{ outcome: string }> };
    let ticking = false;
    const timer = setInterval(() => {
      if (ticking || stopping) return;
      ticking = true;
      worker
        .scheduled({ cron: '* * * * *', scheduledTime: new Date() })
        .then((r) => r.outcome !== 'ok' && say(`cron tick: ${r.outcome}`))
        .catch((err: unknown) => say(`cron tick failed: ${String(err)}`))
        .finally(() => (ticking = false));
    }, CRON_SECONDS * 1000);
    cleanups.push(async () => clearInterval(timer));

    // The demo: a site import as a run, and one import of a page that is not there.
    const defs = siteImportTasks(() => pool);
    const [{ n }] = (await pool.query<{ n: number }>(`SELECT count(*)::int + 1 AS n FROM outlive.runs`)).rows as [{ n: number }];
    const run = await importSite(pool, defs, n, site.sitemapUrl);
    const broken = await enqueue(pool, defs.importPage, { siteId: n, url: `${site.url}/page/404` });
    const drain = new URL('/drain', base).toString();
    const nudged = await nudge(drain, drainSecret);
    const dashboard = new URL(`/dashboard/?token=${encodeURIComponent(token)}`, base).toString();
    say(`site-import run ${run.id} started against ${site.url} (${PAGES} pages, some flaky); task ${broken.id} imports a missing page and will fail`);
    say(`drain webhook nudged: ${nudged.delivered ? 'accepted' : `not delivered (${nudged.error?.message ?? nudged.status}); the cron tick picks it up`}`);
    say(`cron tick every ${CRON_SECONDS}s`);
    console.log('');
    console.log(`  Dashboard: ${dashboard}`);
    console.log(`  CLI:       DATABASE_URL=${server.embedded ? server.url : '$DATABASE_URL'} npx outlive run ${run.id}`);
    console.log('');
    say('running; Ctrl-C to stop');
  } catch (err) {
    console.error(`outlive: ${err instanceof Error ? err.message : String(err)}`);
    await stop();
    process.exit(1);
  }
}

void main();
