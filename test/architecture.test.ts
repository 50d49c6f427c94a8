/**
 * The house as ARCHITECTURE.md draws it: each folder of src/ is a layer, and
 * no file imports from a layer above its own. The entry points (src/index.ts
 * and each runtime's) may import anything.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const src = path.join(root, 'src');

/** The layers, lowest first. */
const LAYERS = ['model', 'db', 'write', 'pass', 'maintenance', 'admin', 'otel', 'http', 'node'] as const;

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : []));
}

const layerOf = (file: string) => LAYERS.indexOf(path.relative(src, file).split(path.sep)[0] as (typeof LAYERS)[number]);

describe('the layers of src/', () => {
  it('every file sits in a layer, and imports only from its own layer or those below', () => {
    const upward: string[] = [];
    const outside: string[] = [];
    for (const file of files(src)) {
      const layer = layerOf(file);
      if (layer < 0) {
        if (path.dirname(file) !== src) outside.push(path.relative(root, file));
        continue; // an entry point at the top of src/
      }
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(/(?:from|import)\s*\(?\s*'(\.{1,2}\/[^']+)'/g)) {
        const target = path.resolve(path.dirname(file), m[1]!);
        if (!target.startsWith(src)) {
          upward.push(`${path.relative(root, file)} imports ${m[1]} from outside src/`);
          continue;
        }
        const to = layerOf(target);
        if (to > layer) upward.push(`${path.relative(root, file)} (${LAYERS[layer]}) imports ${path.relative(root, target)} (${LAYERS[to] ?? 'an entry point'})`);
      }
    }
    expect(outside).toEqual([]);
    expect(upward).toEqual([]);
  });

  it('no file imports zod: a task\'s schema is any Standard Schema, so an app on valibot installs no zod', () => {
    const importers = files(src).filter((file) => /(?:from|import)\s*\(?\s*'zod(?:\/[^']*)?'/.test(readFileSync(file, 'utf8')));
    expect(importers.map((f) => path.relative(root, f))).toEqual([]);
  });
});
