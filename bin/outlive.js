#!/usr/bin/env node
// The `outlive` command. An installed package runs its compiled CLI in dist/.
// A source checkout (src/ beside this folder) runs src/node/cli.ts through
// tsx, a dev dependency there, so `npx outlive ...` needs no build and never
// runs a stale one.
import { existsSync } from 'node:fs';

const source = new URL('../src/node/cli.ts', import.meta.url);
const compiled = new URL('../dist/src/node/cli.js', import.meta.url);
let cli;
try {
  if (existsSync(source)) {
    const { register } = await import('tsx/esm/api');
    register();
    cli = await import(source.href);
  } else {
    cli = await import(compiled.href);
  }
} catch (err) {
  const hint = existsSync(source) ? ' (in a checkout, run `npm install` first)' : '';
  process.stderr.write(`outlive: cannot load the CLI: ${String(err?.message ?? err).split('\n')[0]}${hint}\n`);
  process.exit(1);
}
// Exit explicitly: a tasks module may hold open handles (its own pools) that
// would otherwise keep a stopped worker's process alive.
process.exit(await cli.main(process.argv.slice(2)));
