/**
 * Import a customer's site: crawl its sitemap, import every page it lists
 * (one task per page, in parallel, each retried on its own), then record the
 * import as finished, a step that starts only once every page is in.
 *
 * ```ts
 * await db.transaction(async (tx) => {
 *   const [site] = await tx.insert(sites).values({ url }).returning();
 *   await importSite(tx, site.id, `${url}/sitemap.xml`);
 * });
 * // then passes run: crawl -> page:... (parallel) -> finish
 * ```
 */
import { z } from 'zod';
import { defineTask, NonRetriableError, startRun, step, type Transactional } from 'outlive';

/** What the tasks write through: a pg or Neon pool. */
export interface SqlPool {
  query(text: string, values: unknown[]): Promise<{ rows: unknown[] }>;
}

/** The example's own tables: pages imported, and imports finished. */
export const SITE_IMPORT_TABLES = `
CREATE TABLE IF NOT EXISTS imported_pages (
  site_id integer NOT NULL, url text NOT NULL, title text, bytes integer NOT NULL,
  imported_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (site_id, url));
CREATE TABLE IF NOT EXISTS site_imports (
  site_id integer PRIMARY KEY, pages integer NOT NULL, finished_at timestamptz NOT NULL DEFAULT now());`;

async function get(url: string, signal: AbortSignal): Promise<string> {
  const res = await fetch(url, { signal });
  // 4xx will not get better by retrying; 5xx and network errors may.
  if (res.status >= 400 && res.status < 500) throw new NonRetriableError(`GET ${url}: ${res.status}`);
  if (!res.ok) throw new Error(`GET ${url}: ${res.status}`);
  return res.text();
}

/**
 * The tasks need the database for their own writes; `db` is what they write
 * through (a pool in a worker, a per-request pool on a serverless platform).
 */
export function siteImportTasks(db: () => SqlPool) {
  const importPage = defineTask({
    name: 'site-import.page',
    input: z.object({ siteId: z.number().int(), url: z.string().url() }),
    retry: { maxAttempts: 4, backoff: { baseMs: 1_000 } },
    timeoutMs: 10_000,
    async run({ siteId, url }, ctx) {
      const html = await get(url, ctx.signal);
      const title = /<title>([^<]*)<\/title>/i.exec(html)?.[1] ?? null;
      // Upsert: a page imported twice (at-least-once execution) is stored once.
      await db().query(
        `INSERT INTO imported_pages (site_id, url, title, bytes) VALUES ($1, $2, $3, $4)
         ON CONFLICT (site_id, url) DO UPDATE SET title = excluded.title, bytes = excluded.bytes, imported_at = now()`,
        [siteId, url, title, html.length],
      );
      return { url, title };
    },
  });

  const finishImport = defineTask({
    name: 'site-import.finish',
    input: z.object({ siteId: z.number().int() }),
    async run({ siteId }) {
      const { rows } = await db().query(
        `INSERT INTO site_imports (site_id, pages)
         SELECT $1, count(*)::int FROM imported_pages WHERE site_id = $1
         ON CONFLICT (site_id) DO UPDATE SET pages = excluded.pages, finished_at = now()
         RETURNING pages`,
        [siteId],
      );
      return { pages: (rows[0] as { pages: number }).pages };
    },
  });

  const crawlSitemap = defineTask({
    name: 'site-import.crawl',
    input: z.object({ siteId: z.number().int(), sitemapUrl: z.string().url() }),
    retry: { maxAttempts: 5 },
    async run({ siteId, sitemapUrl }, ctx) {
      const xml = await get(sitemapUrl, ctx.signal);
      const urls = [...new Set([...xml.matchAll(/<loc>\s*([^<\s]+)\s*<\/loc>/g)].map((m) => m[1]!))];
      const pages = urls.map((url) => `page:${url}`);
      urls.forEach((url, i) => ctx.spawn(pages[i]!, step(importPage, { siteId, url })));
      ctx.spawn('finish', step(finishImport, { siteId }, { after: pages }));
      return { pages: urls.length };
    },
  });

  return { crawlSitemap, importPage, finishImport, all: [crawlSitemap, importPage, finishImport] };
}

/** Starts the import of a site, in the caller's transaction. */
export function importSite(tx: Transactional, tasks: ReturnType<typeof siteImportTasks>, siteId: number, sitemapUrl: string) {
  return startRun(tx, `import site ${siteId}`, { crawl: step(tasks.crawlSitemap, { siteId, sitemapUrl }) });
}
