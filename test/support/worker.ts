/**
 * The Cloudflare Worker under test: one of the repository's Worker entries
 * bundled by esbuild (with the tests' tasks module in place of the app's) and
 * run in Miniflare, that is in workerd, the runtime Cloudflare runs. The
 * Worker reaches the real PostgreSQL one of two ways (`WorkerVia`):
 * node-postgres through Miniflare's Hyperdrive binding (`functions/cloudflare.ts`,
 * `nodejs_compat`), or Neon's driver through the WebSocket proxy
 * (`functions/cloudflare-neon.ts`, no `nodejs_compat`). Either way the last
 * hop is a counting proxy, so a test can see the invocation's pool close.
 */
import type { Readable } from 'node:stream';
import { Miniflare } from 'miniflare';
import './miniflare-sockets.js';
import { bundleWorker as bundleWith, type WorkerEntry } from '../../scripts/local/bundle.js';
import { startTcpProxy } from './tcp-proxy.js';
import { startWsProxy } from './ws-proxy.js';

/** The compatibility date the Worker is tested at (as in wrangler.toml). */
export const COMPATIBILITY_DATE = '2026-04-01';

/** Bundles a Worker entry (default the Hyperdrive one), swapping its `./tasks.js` for `tasksModule` when given. */
export function bundleWorker(tasksModule?: string, entry: WorkerEntry = 'hyperdrive'): Promise<string> {
  return bundleWith({ entry, ...(tasksModule ? { tasksModule } : {}) });
}

/** How a Worker under test reaches the database. */
export type WorkerVia = 'hyperdrive' | 'neon';

/** What a Worker needs to reach a database one way: its entry, bindings and Miniflare options. */
export interface WorkerDatabase {
  via: WorkerVia;
  entry: WorkerEntry;
  /** String bindings: `DATABASE_URL` (and `NEON_WS_PROXY`) for Neon's driver; none for Hyperdrive. */
  bindings: Record<string, string>;
  options: WorkerOptions;
  /** The same, for a database URL of the test's choosing (a broken one, say), through the counting proxy unless `direct`. */
  forUrl(url: string, direct?: boolean): { bindings: Record<string, string>; options: WorkerOptions };
  /** Connections the Worker holds open to the database right now. */
  readonly open: number;
  close(): Promise<void>;
}

/** Reaches the database at `url` (with a password: Hyperdrive requires one) `via` one of the two ways. */
export async function workerDatabase(via: WorkerVia, url: string): Promise<WorkerDatabase> {
  const target = new URL(url);
  if (via === 'neon') {
    const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
    const forUrl = (u: string) => ({ bindings: { DATABASE_URL: u, NEON_WS_PROXY: `ws://${proxy.address}` }, options: {} });
    return {
      via,
      entry: 'neon',
      ...forUrl(url),
      forUrl,
      get open() {
        return proxy.open;
      },
      close: () => proxy.close(),
    };
  }
  const proxy = await startTcpProxy(target.hostname, Number(target.port || 5432));
  const forUrl = (u: string, direct = false) => ({
    bindings: {},
    options: { hyperdrives: { HYPERDRIVE: direct ? u : proxy.url(u) }, compatibilityFlags: ['nodejs_compat'] },
  });
  return {
    via,
    entry: 'hyperdrive',
    ...forUrl(url),
    forUrl,
    get open() {
      return proxy.open;
    },
    close: () => proxy.close(),
  };
}

/** Miniflare settings beyond the script and its string bindings. */
export interface WorkerOptions {
  /** Hyperdrive bindings: name to the database's connection string (Miniflare proxies to it). */
  hyperdrives?: Record<string, string>;
  compatibilityFlags?: string[];
}

/** A Worker running in Miniflare, and what it printed. */
export interface RunningWorker {
  mf: Miniflare;
  /** The Worker's URL for a path, on the local socket Miniflare serves it on. */
  url(pathname: string): string;
  /** Calls the Worker's fetch handler over HTTP. */
  fetch(pathname: string, init?: RequestInit): Promise<Response>;
  /** Fires the Worker's scheduled handler and waits for it (and its waitUntil work) to finish. */
  scheduled(cron?: string): Promise<{ outcome: string }>;
  /** Everything the Worker wrote to stdout and stderr so far. */
  output(): string;
  dispose(): Promise<void>;
}

/** Starts the bundled Worker with these bindings. */
export async function startWorker(script: string, bindings: Record<string, string>, options: WorkerOptions = {}): Promise<RunningWorker> {
  let output = '';
  const mf = new Miniflare({
    modules: true,
    script,
    compatibilityDate: COMPATIBILITY_DATE,
    bindings,
    ...(options.hyperdrives ? { hyperdrives: options.hyperdrives } : {}),
    ...(options.compatibilityFlags ? { compatibilityFlags: options.compatibilityFlags } : {}),
    handleRuntimeStdio(stdout: Readable, stderr: Readable) {
      stdout.on('data', (chunk: Buffer) => (output += String(chunk)));
      stderr.on('data', (chunk: Buffer) => (output += String(chunk)));
    },
  });
  let base: URL;
  try {
    base = await mf.ready;
  } catch (err) {
    throw new Error(`workerd did not start:\n${output}`, { cause: err });
  }
  let disposed = false;
  return {
    mf,
    // Over real HTTP to workerd's socket (Miniflare's dispatchFetch turns a
    // body into a stream, which fetch refuses to resend on a 401).
    url: (pathname) => new URL(pathname, base).toString(),
    fetch: (pathname, init) => fetch(new URL(pathname, base), init),
    async scheduled(cron = '* * * * *') {
      // Miniflare types the Worker with workers-types, which this project does not load.
      const worker = (await mf.getWorker()) as unknown as {
        scheduled(options: { cron: string; scheduledTime: Date }): Promise<{ outcome: string }>;
      };
      return worker.scheduled({ cron, scheduledTime: new Date() });
    },
    output: () => output,
    async dispose() {
      if (disposed) return;
      disposed = true;
      await mf.dispose();
    },
  };
}
