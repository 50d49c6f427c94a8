/**
 * The package as an app installs it: `npm pack` of a copy of this checkout
 * (its build runs in the copy, never in the checkout other tests read),
 * made once per state of the sources and shared by the test files that
 * install it (package.test.ts, next-app.test.ts), even when they run at
 * the same time.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const PACKED = ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src', 'db', 'bin', 'README.md'];
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

function filesOf(entry: string): string[] {
  const full = path.join(ROOT, entry);
  if (!statSync(full).isDirectory()) return [entry];
  return readdirSync(full).sort().flatMap((name) => filesOf(path.join(entry, name)));
}

/** A hash of everything the tarball is made from. */
function sourcesHash(): string {
  const hash = createHash('sha256');
  for (const file of PACKED.flatMap(filesOf)) hash.update(file).update('\0').update(readFileSync(path.join(ROOT, file))).update('\0');
  return hash.digest('hex').slice(0, 16);
}

/**
 * The path of the packed tarball for the sources as they are now: packed
 * here if no process has packed them yet, else the one it packed.
 */
export async function packedTarball(): Promise<string> {
  const dir = path.join(tmpdir(), `outlive-packed-${sourcesHash()}`);
  const done = path.join(dir, 'done');
  const lock = `${dir}.lock`;
  for (const deadline = Date.now() + 300_000; ; ) {
    if (existsSync(done)) return path.join(done, readdirSync(done).find((f) => f.endsWith('.tgz'))!);
    try {
      mkdirSync(lock); // atomic: one process packs, the others wait for `done`
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`packedTarball: ${lock} held for 5 minutes; remove it if no test is running`);
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  try {
    rmSync(dir, { recursive: true, force: true });
    const copy = path.join(dir, 'repo');
    for (const entry of PACKED) cpSync(path.join(ROOT, entry), path.join(copy, entry), { recursive: true });
    symlinkSync(path.join(ROOT, 'node_modules'), path.join(copy, 'node_modules'), 'dir');
    const out = path.join(dir, 'out');
    mkdirSync(out);
    await run(npm, ['pack', '--pack-destination', out], { cwd: copy, timeout: 240_000 });
    renameSync(out, done);
    rmSync(copy, { recursive: true, force: true });
    return path.join(done, readdirSync(done).find((f) => f.endsWith('.tgz'))!);
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}
