/**
 * The README's "Use it in your app" shows files the tests run: each snippet
 * there is, line for line (comments aside), a file of examples/next (built
 * and called by next-app.test.ts) or of functions/ (the Worker the Worker
 * suites run), so the README cannot drift from what works.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const root = new URL('../', import.meta.url);
const readme = readFileSync(new URL('README.md', root), 'utf8');
const section = readme.slice(readme.indexOf('## Use it in your app'), readme.indexOf('## Contents'));

/** A file's code lines: no comment lines, no blank ones. */
const codeOf = (text: string) =>
  text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('//') && !l.startsWith('/*') && !l.startsWith('*'));

/** The code blocks of the section, as code lines. */
const blocks = [...section.matchAll(/```(?:ts|toml|sh)\n([\s\S]*?)```/g)].map((m) => codeOf(m[1]!));

describe("the README's Use it in your app", () => {
  for (const [file, transform] of [
    ['examples/next/app/api/cron/route.ts', (l: string) => l],
    ['examples/next/app/api/drain/route.ts', (l: string) => l],
    ['examples/next/app/api/dashboard/[[...path]]/route.ts', (l: string) => l],
    ['examples/next/lib/tasks.ts', (l: string) => l],
    // The repository's Worker imports its tasks from beside it, as the README's does.
    ['functions/cloudflare.ts', (l: string) => l],
  ] as const) {
    it(`shows ${file} as it is`, () => {
      const code = codeOf(readFileSync(new URL(file, root), 'utf8')).map(transform);
      expect(blocks, `no snippet in the README is ${file}`).toContainEqual(code);
    });
  }

  it('names the wrangler settings the repository deploys with', () => {
    const toml = readFileSync(new URL('wrangler.toml', root), 'utf8');
    for (const line of ['compatibility_flags = ["nodejs_compat"]', 'binding = "HYPERDRIVE"', /compatibility_date = "[\d-]+"/.exec(toml)![0]]) {
      expect(toml).toContain(line);
      expect(section).toContain(line);
    }
  });
});

describe("the README's Flow control", () => {
  it('shows the task examples/generate-pages.ts defines, as it is (test/examples.test.ts runs it)', () => {
    const example = readFileSync(new URL('examples/generate-pages.ts', root), 'utf8');
    const region = example.slice(example.indexOf('// #region generate-page\n') + '// #region generate-page\n'.length, example.indexOf('// #endregion generate-page'));
    expect(region).toContain("name: 'generate-page'");
    const section = readme.slice(readme.indexOf('## Flow control'), readme.indexOf('## Serverless: cron ticks'));
    expect(section).toContain('```ts\n' + region + '```');
  });
});
