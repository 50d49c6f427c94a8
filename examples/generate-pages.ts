/**
 * The essay's heavy work under a provider's limits: a model builds each page
 * of a customer's imported site, called under the provider's limits (5 calls
 * at once, 60 requests and 200,000 tokens a minute), one import per customer
 * at a time, customers sharing the workers in turn. `model` stands in for the
 * provider: it answers 429 when called past its limits, like the real one.
 *
 * Run its passes like any other tasks': `tick(pool, { tasks: [generatePage] })`
 * from a cron route or a drain, or the worker.
 */
import { z } from 'zod';
import { defineTask, enqueueMany, RateLimitedError, type Transactional } from 'outlive';

/** A model provider with a provider's rules: 5 calls at once, 60 a minute; past them, a 429 with Retry-After. */
export const model = {
  running: 0,
  mostAtOnce: 0,
  calls: [] as number[],
  refused: 0,
  async generate(prompt: string, signal: AbortSignal): Promise<{ status: number; retryAfterMs?: number; html?: string; tokens?: number }> {
    const now = Date.now();
    this.calls = this.calls.filter((t) => t > now - 60_000);
    if (this.running >= 5 || this.calls.length >= 60) {
      this.refused++;
      return { status: 429, retryAfterMs: 1_000 };
    }
    this.calls.push(now);
    this.running++;
    this.mostAtOnce = Math.max(this.mostAtOnce, this.running);
    try {
      await new Promise((r) => setTimeout(r, 5));
      signal.throwIfAborted();
      return { status: 200, html: `<h1>${prompt}</h1>`, tokens: 800 + (prompt.length % 400) };
    } finally {
      this.running--;
    }
  },
};

// #region generate-page
export const generatePage = defineTask({
  name: 'generate-page',
  input: z.object({ customerId: z.string(), pageId: z.string(), estTokens: z.number() }),
  limits: [
    { key: 'openai', concurrency: 5 }, // at most 5 running, across every worker
    { key: 'openai', rate: { limit: 60, periodMs: 60_000 } }, // at most 60 starts in any 60 s
    { key: 'openai-tokens', rate: { limit: 200_000, periodMs: 60_000 }, cost: (i) => i.estTokens },
    { key: (i) => `import:${i.customerId}`, concurrency: 1 }, // one page at a time per customer
  ],
  fairness: { key: (i) => i.customerId }, // customers share the queue in turn
  async run({ pageId }, ctx) {
    const res = await model.generate(`page ${pageId}`, ctx.signal);
    // The provider said no: the key pauses for every worker, and this task waits without spending an attempt.
    if (res.status === 429) throw new RateLimitedError({ key: 'openai', retryAfterMs: res.retryAfterMs ?? 1_000 });
    ctx.reportCost(res.tokens!, 'openai-tokens'); // what it really cost, in place of the estimate
    return { pageId, bytes: res.html!.length };
  },
});
// #endregion generate-page

/** A customer's site import: one task per page, written in the caller's transaction. */
export async function importSite(tx: Transactional, customerId: string, pageIds: readonly string[]) {
  return enqueueMany(
    tx,
    generatePage,
    pageIds.map((pageId) => ({ customerId, pageId, estTokens: 1_000 })),
  );
}
