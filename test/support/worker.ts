/**
 * The Cloudflare Worker under test: `functions/cloudflare.ts` bundled by
 * esbuild (with the tests' tasks module in place of the app's) and run in
 * Miniflare, that is in workerd, the runtime Cloudflare runs. The Worker
 * reaches the real PostgreSQL through the Neon driver and the WebSocket proxy.
 */
import type { Readable } from 'node:stream';
import { Miniflare } from 'miniflare';
import { bundleWorker as bundleWith } from '../../scripts/local/bundle.js';


/** The compatibility date the Worker is tested at (as in wrangler.toml). */
export const COMPATIBILITY_DATE = '2025-09-01';

/** Bundles the Worker, swapping its `./tasks.js` for `tasksModule` when given. */
export function bundleWorker(tasksModule?: string): Promise<string> {
  return bundleWith(tasksModule ? { tasksModule } : {});
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
export async function startWorker(script: string, bindings: Record<string, string>): Promise<RunningWorker> {
  let output = '';
  const mf = new Miniflare({
    modules: true,
    script,
    compatibilityDate: COMPATIBILITY_DATE,
    bindings,
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
