import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { explainRun, tick } from '../src/index.js';
import { importSite, SITE_IMPORT_TABLES, siteImportTasks } from '../examples/site-import.js';
import { freshDb } from './support/db.js';
import { startSite } from './support/site.js';

const db = await freshDb();
await db.pool.query(SITE_IMPORT_TABLES);
const tasks = siteImportTasks(() => db.pool);

/** Runs passes until nothing is claimable, moving the clock on 10 minutes a pass so backoffs come due without sleeping. */
async function drain(start = new Date()) {
  let now = start;
  for (let i = 0; i < 100; i++) {
    const r = await tick(db.pool, { tasks: tasks.all, concurrency: 8, now });
    const [{ open }] = (await db.rows<{ open: number }>(`SELECT count(*)::int AS open FROM outlive.tasks WHERE state IN ('pending', 'running')`)) as [{ open: number }];
    if (open === 0 && r.claimed === 0) return i;
    now = new Date(now.getTime() + 600_000);
  }
  throw new Error('the import did not settle');
}

describe('import a site', () => {
  it('crawls the sitemap, imports every page in parallel, then finishes; flaky pages are retried', async () => {
    const site = await startSite({ pages: 25, failures: { '/page/3': 1, '/page/7': 2, '/page/11': 1 } });
    try {
      const client = await db.pool.connect();
      await client.query('BEGIN');
      const run = await importSite(client, tasks, 1, site.sitemapUrl);
      await client.query('COMMIT');
      client.release();
      await drain();
      const explained = await explainRun(db.pool, run.id);
      expect(explained).toMatchObject({ state: 'succeeded', counts: { succeeded: 27 } });
      expect(await db.rows(`SELECT site_id, pages FROM site_imports`)).toEqual([{ site_id: 1, pages: 25 }]);
      expect(site.hits.get('/page/7')).toBe(3);
      const [finish] = await db.rows<{ started_at: Date }>(`SELECT started_at FROM outlive.tasks WHERE run_id = $1 AND step = 'finish'`, [run.id]);
      const [last] = await db.rows<{ at: Date }>(`SELECT max(finished_at) AS at FROM outlive.tasks WHERE run_id = $1 AND step LIKE 'page:%'`, [run.id]);
      expect(finish!.started_at.getTime()).toBeGreaterThanOrEqual(last!.at.getTime());
    } finally {
      await site.close();
    }
  });

  it('fails the run when a page always fails, and never runs the final step', async () => {
    const site = await startSite({ pages: 6, failures: { '/page/2': Infinity } });
    try {
      const run = await importSite(db.pool, tasks, 2, site.sitemapUrl);
      await drain();
      const explained = await explainRun(db.pool, run.id);
      expect(explained!.state).toBe('failed');
      const page2 = explained!.tasks.find((t) => t.step === `page:${site.url}/page/2`)!;
      expect(page2).toMatchObject({ state: 'failed', attempts: 4 });
      expect(explained!.error).toBe(`step "page:${site.url}/page/2" (task ${page2.id}) failed`);
      const finish = explained!.tasks.find((t) => t.step === 'finish')!;
      expect(finish.state).toBe('skipped');
      expect(finish.why).toMatch(/not run: upstream step "page:.*\/page\/2" .* failed/);
      expect(await db.rows(`SELECT 1 FROM site_imports WHERE site_id = 2`)).toHaveLength(0);
      expect(await db.rows(`SELECT 1 FROM imported_pages WHERE site_id = 2`)).toHaveLength(5);
    } finally {
      await site.close();
    }
  });

  it('loses nothing when a pass is killed in the middle: recovery reclaims its tasks and the import finishes', async () => {
    const site = await startSite({ pages: 12, delayMs: 400 });
    try {
      const run = await importSite(db.pool, tasks, 3, site.sitemapUrl);
      const child = spawn(process.execPath, ['--conditions=outlive-source', '--import', 'tsx', fileURLToPath(new URL('./support/site-import-pass.ts', import.meta.url)), db.url], {
        stdio: 'ignore',
      });
      // Wait until the child holds page tasks mid-flight, then kill it without warning.
      for (;;) {
        const rows = await db.rows(`SELECT 1 FROM outlive.tasks WHERE run_id = $1 AND state = 'running' AND step LIKE 'page:%'`, [run.id]);
        if (rows.length >= 2) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
      const stuck = await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks WHERE run_id = $1 AND state = 'running'`, [run.id]);
      expect(stuck[0]!.n).toBeGreaterThan(0);
      // Passes an hour later: the dead pass's leases have expired.
      await drain(new Date(Date.now() + 3_600_000));
      const explained = await explainRun(db.pool, run.id);
      expect(explained!.state).toBe('succeeded');
      expect(explained!.tasks.some((t) => t.attempts === 2)).toBe(true);
      expect(await db.rows(`SELECT pages FROM site_imports WHERE site_id = 3`)).toEqual([{ pages: 12 }]);
    } finally {
      await site.close();
    }
  });
});
