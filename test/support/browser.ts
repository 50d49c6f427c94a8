/**
 * The Chromium the browser tests drive through playwright-core: the one in
 * OUTLIVE_CHROMIUM, else Debian's where it is installed, else the build the
 * `@sparticuz/chromium` dev dependency ships inside its npm package
 * (unpacked into the temporary directory on first use), so `npm test` needs
 * no apt package on a bare machine. Never skipped: without a browser the
 * tests fail and say why.
 */
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

const DEBIAN = '/usr/bin/chromium';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'];

/** Launches headless Chromium; says which one in `browser.which`. */
export async function launchChromium(): Promise<{ browser: Browser; which: string }> {
  const chosen = process.env.OUTLIVE_CHROMIUM;
  if (chosen) {
    if (!existsSync(chosen)) throw new Error(`OUTLIVE_CHROMIUM is ${chosen}, which does not exist`);
    return { browser: await chromium.launch({ executablePath: chosen, args: FLAGS }), which: chosen };
  }
  if (existsSync(DEBIAN)) return { browser: await chromium.launch({ executablePath: DEBIAN, args: FLAGS }), which: DEBIAN };
  const { default: packaged } = await import('@sparticuz/chromium');
  const executablePath = await packaged.executablePath();
  return { browser: await chromium.launch({ executablePath, args: [...packaged.args, ...FLAGS] }), which: `@sparticuz/chromium (${executablePath})` };
}
