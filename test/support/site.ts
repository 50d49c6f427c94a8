/**
 * A small website on 127.0.0.1 for the site-import example: a sitemap and
 * pages, some of which fail a given number of times before they answer.
 */
import { createServer, type Server } from 'node:http';

/** A running local site. */
export interface LocalSite {
  url: string;
  sitemapUrl: string;
  /** Requests served per path. */
  hits: Map<string, number>;
  close(): Promise<void>;
}

/**
 * Serves `pages` pages; `failures[path]` is how many times that page answers
 * 500 before it answers 200 (Infinity: always). `delayMs` slows every page.
 */
export async function startSite(options: { pages: number; failures?: Record<string, number>; delayMs?: number }): Promise<LocalSite> {
  const hits = new Map<string, number>();
  let base = '';
  const server: Server = createServer((req, res) => {
    const path = req.url ?? '/';
    const n = (hits.get(path) ?? 0) + 1;
    hits.set(path, n);
    const reply = () => {
      if (path === '/sitemap.xml') {
        const locs = Array.from({ length: options.pages }, (_, i) => `<url><loc>${base}/page/${i}</loc></url>`).join('');
        res.writeHead(200, { 'content-type': 'application/xml' }).end(`<?xml version="1.0"?><urlset>${locs}</urlset>`);
        return;
      }
      const m = /^\/page\/(\d+)$/.exec(path);
      if (!m || Number(m[1]) >= options.pages) {
        res.writeHead(404).end('not found');
        return;
      }
      if (n <= (options.failures?.[path] ?? 0)) {
        res.writeHead(500).end('server error');
        return;
      }
      res.writeHead(200, { 'content-type': 'text/html' }).end(`<html><title>Page ${m[1]}</title><body>${'lorem '.repeat(50)}</body></html>`);
    };
    if (options.delayMs) setTimeout(reply, options.delayMs);
    else reply();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  base = `http://127.0.0.1:${port}`;
  return {
    url: base,
    sitemapUrl: `${base}/sitemap.xml`,
    hits,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
