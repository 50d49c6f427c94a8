/**
 * The serverless phase: the Cloudflare Worker of functions/cloudflare.ts,
 * bundled with esbuild as Wrangler would and run in Miniflare (workerd),
 * reaching PostgreSQL through the Neon WebSocket driver and a local
 * WebSocket-to-TCP proxy (test/support/ws-proxy.ts, the tests' own). The
 * harness POSTs signed `/drain` requests, each of which runs one bounded
 * pass, until the queue is empty.
 *
 * Runs in the outlive process (machine's Node); esbuild, miniflare and ws are
 * devDependencies of the repository root.
 */
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { Miniflare } from 'miniflare';
import { signNudge, SIGNATURE_HEADER } from '../../src/http/nudge.ts';
import { startWsProxy } from '../../test/support/ws-proxy.ts';
import { bundleWorker } from '../../scripts/local/bundle.ts';


function bundle(): Promise<string> {
  return bundleWorker({ entry: 'neon', tasksModule: fileURLToPath(new URL('./worker-tasks.ts', import.meta.url)) });
}

/** What the serverless phase measured. */
export interface ServerlessResult {
  /** Wall time from the first drain request to the response of the last pass that found work, ms. */
  ms: number;
  /** Bundling and starting workerd, ms (not in `ms`). */
  startMs: number;
  /** Passes that found work (the empty pass that ends the loop is not counted). */
  passes: number;
  claimed: number;
  /** WebSocket messages the driver sent towards Postgres (its writes: close to its round trips). */
  messages: number;
  /** WebSocket connections opened (one Neon pool per invocation). */
  connections: number;
  /** Payload indexes the Worker printed, one per handler call. */
  ran: number[];
}

/** Runs signed drain passes through the Worker until the queue is empty. */
export async function serverlessDrain(url: string, options: { concurrency: number; budgetMs: number; maxPasses: number }): Promise<ServerlessResult> {

  const started = performance.now();
  const target = new URL(url);
  const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
  const secret = Array.from(globalThis.crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
  let output = '';
  const mf = new Miniflare({
    modules: true,
    script: await bundle(),
    compatibilityDate: '2025-09-01',
    bindings: {
      DATABASE_URL: url,
      NEON_WS_PROXY: proxy.address,
      OUTLIVE_DRAIN_SECRET: secret,
      OUTLIVE_CONCURRENCY: String(options.concurrency),
      OUTLIVE_BUDGET_MS: String(options.budgetMs),
    },
    handleRuntimeStdio(stdout: Readable, stderr: Readable) {
      stdout.on('data', (chunk: Buffer) => (output += String(chunk)));
      stderr.on('data', (chunk: Buffer) => (output += String(chunk)));
    },
  });
  try {
    const base = await mf.ready;
    const startMs = performance.now() - started;
    proxy.resetCounts();
    let passes = 0;
    let claimed = 0;
    const t0 = performance.now();
    let lastWorkAt = t0;
    for (;;) {
      if (passes >= options.maxPasses) throw new Error(`the queue was not empty after ${passes} drain passes`);
      const body = '';
      const url = new URL('/drain', base);
      const response = await fetch(url, {
        method: 'POST',
        headers: { [SIGNATURE_HEADER]: await signNudge(secret, url.toString(), body) },
        body,
      });
      const text = await response.text();
      if (response.status !== 200) throw new Error(`POST /drain answered ${response.status}: ${text.slice(0, 500)}\n${output.slice(-2000)}`);
      const report = (JSON.parse(text) as { report: { claimed: number } }).report;
      if (report.claimed === 0) break;
      // A synchronous drain answers after its pass has settled everything it claimed.
      passes++;
      claimed += report.claimed;
      lastWorkAt = performance.now();
    }
    const ms = lastWorkAt - t0;
    const ran = [...output.matchAll(/bench-ran (\d+)/g)].map((m) => Number(m[1]));
    return { ms, startMs, passes, claimed, messages: proxy.messages, connections: proxy.opened, ran };
  } finally {
    await mf.dispose();
    await proxy.close();
  }
}
