/**
 * What a Worker weighs with each schema library: the README's Worker
 * (`createCloudflareWorker` from `outlive/cloudflare`, one task) bundled as
 * Wrangler bundles it (esbuild, ES module, `platform: 'neutral'`, the
 * Workers conditions, minified), once per library, with the library's share
 * of the bundle read from esbuild's metafile.
 *
 *   node --conditions=outlive-source --import tsx scripts/bundle-size.ts
 *
 * `outlive/...` resolves to this checkout's sources (the `outlive-source`
 * condition), which the published build compiles one to one. The numbers
 * are in docs/deploy.md; test/standard-schema.test.ts bundles the valibot
 * Worker through {@link bundleWorkerWith} to keep zod out of the core.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { build, type Metafile } from 'esbuild';
import { WORKERD_BUILD } from './local/bundle.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The schema libraries measured, each with the README's one task written in it. */
export const WORKERS = {
  zod: {
    library: 'zod',
    source: `import { z } from 'zod';
const input = z.object({ email: z.string().email() });`,
  },
  valibot: {
    library: 'valibot',
    source: `import * as v from 'valibot';
const input = v.object({ email: v.pipe(v.string(), v.email()) });`,
  },
  arktype: {
    library: 'arktype',
    source: `import { type } from 'arktype';
const input = type({ email: 'string.email' });`,
  },
  // outlive alone: a hand-written Standard Schema, no library at all.
  none: {
    library: null,
    source: `const input = { '~standard': { version: 1, vendor: 'app', validate: (value) => ({ value }) } };`,
  },
} as const;

/** Which Worker to bundle. */
export type SchemaLibrary = keyof typeof WORKERS;

/** One bundled Worker: its code and what went into it. */
export interface BundledWorker {
  code: string;
  metafile: Metafile;
}

/** Bundles the README's Worker with its task's schema written in `library`, as Wrangler would. */
export async function bundleWorkerWith(library: SchemaLibrary, options: { minify?: boolean } = {}): Promise<BundledWorker> {
  const contents = `${WORKERS[library].source}
import { defineTask } from 'outlive';
import { createCloudflareWorker } from 'outlive/cloudflare';
const sendWelcome = defineTask({ name: 'send-welcome', input, run: async ({ email }) => ({ sent: email }) });
export default createCloudflareWorker(() => [sendWelcome]);
`;
  const result = await build({
    ...WORKERD_BUILD,
    conditions: [...WORKERD_BUILD.conditions],
    mainFields: [...WORKERD_BUILD.mainFields],
    stdin: { contents, resolveDir: root, sourcefile: `worker-${library}.ts`, loader: 'ts' },
    minify: options.minify ?? true,
    metafile: true,
  });
  return { code: result.outputFiles[0]!.text, metafile: result.metafile };
}

/** The modules of a bundle that come from one package in node_modules. */
export function modulesOf(metafile: Metafile, pkg: string): string[] {
  return Object.keys(metafile.inputs).filter((i) => i.includes(`node_modules/${pkg}/`));
}

/** Bytes a package contributes to the bundle's output. */
function bytesFrom(metafile: Metafile, pkg: string): number {
  const [output] = Object.values(metafile.outputs);
  return Object.entries(output!.inputs)
    .filter(([file]) => file.includes(`node_modules/${pkg}/`) || (pkg === 'arktype' && file.includes('node_modules/@ark/')))
    .reduce((sum, [, { bytesInOutput }]) => sum + bytesInOutput, 0);
}

const kib = (bytes: number) => (bytes / 1024).toFixed(0);

async function main(): Promise<void> {
  // Wrangler minifies only when told to (`minify = true`), so both are shown.
  const rows = [['schema library', 'KiB', 'minified KiB', 'minified, gzip KiB', 'of the minified, the library\'s KiB']];
  for (const library of Object.keys(WORKERS) as SchemaLibrary[]) {
    const plain = await bundleWorkerWith(library, { minify: false });
    const { code, metafile } = await bundleWorkerWith(library);
    const own = WORKERS[library].library;
    rows.push([
      own ?? 'none (a hand-written schema)',
      kib(Buffer.byteLength(plain.code)),
      kib(Buffer.byteLength(code)),
      kib(gzipSync(code).length),
      own ? kib(bytesFrom(metafile, own)) : '0',
    ]);
  }
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  const line = (r: string[]) => `| ${r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join(' | ')} |`;
  console.log(line(rows[0]!));
  console.log(`|${widths.map((w, c) => (c === 0 ? '-'.repeat(w + 2) : `${'-'.repeat(w + 1)}:`)).join('|')}|`);
  for (const r of rows.slice(1)) console.log(line(r));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main();
