/**
 * Bundles the Cloudflare Worker as Wrangler would (an ES module, Workers
 * conditions), for Miniflare: the local stack, the tests and the benchmarks
 * all run the Worker through this one function.
 *
 * Node built-ins are left to workerd, as Wrangler leaves them under
 * `nodejs_compat`: an `import` stays an import of `node:<name>`, and a
 * `require` of one (node-postgres uses `require`) becomes a module that
 * imports it, since an ES module bundle has no `require` at run time. A
 * Worker without `nodejs_compat` (the Neon entry) imports none.
 */
import { builtinModules } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build, type BuildOptions, type Plugin } from 'esbuild';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** The Worker entries of this repository. */
export const WORKER_ENTRIES = {
  /** node-postgres through the Hyperdrive binding (or straight to DATABASE_URL); needs `nodejs_compat`. */
  hyperdrive: 'functions/cloudflare.ts',
  /** Neon's WebSocket driver only; needs no `nodejs_compat`. */
  neon: 'functions/cloudflare-neon.ts',
} as const;

/** Which of the repository's Worker entries. */
export type WorkerEntry = keyof typeof WORKER_ENTRIES;

/** What to swap in when bundling. */
export interface BundleOptions {
  /** Which entry: default `hyperdrive`, the one wrangler.toml deploys. */
  entry?: WorkerEntry;
  /** The module that stands in for `functions/tasks.ts` (a path from the repository root, or absolute). */
  tasksModule?: string;
}

const NODE_BUILTINS = new Set(builtinModules.filter((m) => !m.startsWith('_')));

/** Leaves Node built-ins to workerd's `nodejs_compat`, turning each `require` of one into an import. */
export const nodeBuiltins: Plugin = {
  name: 'node-builtins',
  setup(b) {
    b.onResolve({ filter: /^(node:)?[a-z_/]+$/ }, (args) => {
      const name = args.path.replace(/^node:/, '');
      if (!args.path.startsWith('node:') && !NODE_BUILTINS.has(name)) return undefined;
      if (args.kind === 'require-call') return { path: `node:${name}`, namespace: 'node-require' };
      return { path: `node:${name}`, external: true };
    });
    b.onLoad({ filter: /.*/, namespace: 'node-require' }, (args) => ({
      contents: `import builtin from '${args.path}';\nmodule.exports = builtin;\n`,
      loader: 'js',
    }));
  },
};

/**
 * How Wrangler bundles a Worker: one ES module for workerd's conditions,
 * with `outlive/...` resolved to this repository's sources (package.json's
 * exports).
 */
export const WORKERD_BUILD = {
  bundle: true,
  format: 'esm',
  platform: 'neutral',
  conditions: ['outlive-source', 'workerd', 'worker', 'browser'],
  mainFields: ['module', 'main'],
  target: 'es2022',
  write: false,
  logLevel: 'silent',
} as const satisfies BuildOptions;

/** The Worker's bundled source, for Miniflare's `script`. */
export async function bundleWorker(options: BundleOptions = {}): Promise<string> {
  const entry = path.join(root, WORKER_ENTRIES[options.entry ?? 'hyperdrive']);
  const swap: Plugin = {
    name: 'outlive-tasks',
    setup(b) {
      if (!options.tasksModule) return;
      const tasks = path.resolve(root, options.tasksModule);
      b.onResolve({ filter: /^\.\/tasks\.js$/ }, (args) => (args.importer === entry ? { path: tasks } : undefined));
    },
  };
  const result = await build({ ...WORKERD_BUILD, conditions: [...WORKERD_BUILD.conditions], mainFields: [...WORKERD_BUILD.mainFields], entryPoints: [entry], plugins: [swap, nodeBuiltins] });
  return result.outputFiles[0]!.text;
}

/** The local stack's Worker: `scripts/local/tasks.ts` as its tasks, with the site-import example. */
export function bundleLocalWorker(): Promise<string> {
  return bundleWorker({ tasksModule: 'scripts/local/tasks.ts' });
}
