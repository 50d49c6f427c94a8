/**
 * Bundles the Cloudflare Worker as Wrangler would (an ES module, Workers
 * conditions), for Miniflare: the local stack, the tests and the benchmarks
 * all run the Worker through this one function.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build, type Plugin } from 'esbuild';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** What to swap in when bundling. */
export interface BundleOptions {
  /** The module that stands in for `functions/tasks.ts` (a path from the repository root, or absolute). */
  tasksModule?: string;
}

/** The Worker's bundled source, for Miniflare's `script`. */
export async function bundleWorker(options: BundleOptions = {}): Promise<string> {
  const entry = path.join(root, 'functions/cloudflare.ts');
  const swap: Plugin = {
    name: 'outlive-tasks',
    setup(b) {
      if (!options.tasksModule) return;
      const tasks = path.resolve(root, options.tasksModule);
      b.onResolve({ filter: /^\.\/tasks\.js$/ }, (args) => (args.importer === entry ? { path: tasks } : undefined));
    },
  };
  const result = await build({
    entryPoints: [entry],
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    // `outlive/...` resolves to this repository's sources (package.json's exports).
    conditions: ['outlive-source', 'workerd', 'worker', 'browser'],
    mainFields: ['module', 'main'],
    target: 'es2022',
    write: false,
    plugins: [swap],
    logLevel: 'silent',
  });
  return result.outputFiles[0]!.text;
}

/** The local stack's Worker: `scripts/local/tasks.ts` as its tasks, with the site-import example. */
export function bundleLocalWorker(): Promise<string> {
  return bundleWorker({ tasksModule: 'scripts/local/tasks.ts' });
}
