#!/usr/bin/env node
// The `outlive` command. Runs the compiled CLI in dist/; in a source checkout
// without a build, run it as `node --import tsx bin/outlive.js` and it loads
// src/cli.ts instead.
import { existsSync } from 'node:fs';

const compiled = new URL('../dist/src/cli.js', import.meta.url);
let cli;
try {
  cli = await import(existsSync(compiled) ? compiled.href : new URL('../src/cli.ts', import.meta.url).href);
} catch (err) {
  const hint = err?.code === 'ERR_UNKNOWN_FILE_EXTENSION' ? ' (no build in dist/: run `npm run build`, or node --import tsx)' : '';
  process.stderr.write(`outlive: cannot load the CLI: ${String(err?.message ?? err).split('\n')[0]}${hint}\n`);
  process.exit(1);
}
// Exit explicitly: a tasks module may hold open handles (its own pools) that
// would otherwise keep a stopped worker's process alive.
process.exit(await cli.main(process.argv.slice(2)));
