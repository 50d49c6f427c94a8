/**
 * The Cloudflare Worker under test: `functions/cloudflare.ts` bundled by
 * esbuild (with the tests' tasks module in place of the app's) and run in
 * Miniflare, that is in workerd, the runtime Cloudflare runs. The Worker
 * reaches the real PostgreSQL through the Neon driver and the WebSocket proxy.
 */
import path from 'node:path';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { build, type Plugin } from 'esbuild';
import { Miniflare } from 'miniflare';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** The compatibility date the Worker is tested at (as in wrangler.toml). */
export const COMPATIBILITY_DATE = '2025-09-01';

/**
 * Bundles `functions/cloudflare.ts` as Wrangler would (ES module, Workers
 * conditions), swapping its `./tasks.js` for `tasksModule` when given.
 */
export async function bundleWorker(tasksModule?: string): Promise<string> {
  const swap: Plugin = {
    name: 'swap-tasks',
    setup(b) {
      if (!tasksModule) return;
      b.onResolve({ filter: /^\.\/tasks\.js$/ }, (args) =>
        args.importer === path.join(root, 'functions/cloudflare.ts') ? { path: path.resolve(tasksModule) } : undefined,
      );
    },
  };
  const result = await build({
    entryPoints: [path.join(root, 'functions/cloudflare.ts')],
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    conditions: ['workerd', 'worker', 'browser'],
    mainFields: ['module', 'main'],
    target: 'es2022',
    write: false,
    plugins: [swap],
    logLevel: 'silent',
  });
  return result.outputFiles[0]!.text;
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
