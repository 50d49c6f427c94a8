/**
 * The essay's first example: a model takes minutes to build a page, and no
 * invocation waits for it. A run of three steps, each one short HTTP call:
 *
 * 1. `start`: starts a background response (`background: true`) and keeps
 *    its id as the step's output;
 * 2. `callback`: waits for the provider's webhook, a signal keyed by that id
 *    (`/signal` verifies its Standard Webhooks signature; the same
 *    `webhook-id` twice is one signal, and one sent before the wait begins
 *    is kept for it), ending with `null` if none came in ten minutes;
 * 3. `store`: retrieves the response (the webhook's payload is thin) and
 *    stores the page; while the model still works it polls, snoozing 30 s
 *    at a time without spending an attempt, until an hour has passed.
 *
 * The provider does not deduplicate a start sent twice: should a pass die
 * between the start and its settle, the retried start pays for a second
 * response, and the page is built from the one the run waits for.
 */
import { z } from 'zod';
import { defineTask, NonRetriableError, startRun, step, waitFor, type Transactional } from 'outlive';

/** Where the model provider is, and its key. */
export interface ModelProvider {
  url: string;
  apiKey: string;
}

/** How long the run waits for the webhook before it polls, and how long it polls. */
export const CALLBACK_TIMEOUT_MS = 600_000;
export const POLL_EVERY_MS = 30_000;
export const GIVE_UP_AFTER_S = 3_600;

/** The page tasks for a provider, storing pages with `savePage`. */
export function pageTasks(provider: ModelProvider, savePage: (pageId: string, html: string) => Promise<void>) {
  const headers = { authorization: `Bearer ${provider.apiKey}`, 'content-type': 'application/json' };

  const storePage = defineTask({
    name: 'store-page',
    input: z.object({ pageId: z.string(), responseId: z.string() }),
    timeoutMs: 5_000,
    async run({ pageId, responseId }, ctx) {
      const res = await fetch(`${provider.url}/v1/responses/${responseId}`, { headers, signal: ctx.signal });
      if (!res.ok) throw new Error(`retrieving ${responseId}: HTTP ${res.status}`);
      const response = (await res.json()) as { status: string; created_at: number; output?: { content: { text: string }[] }[] };
      if (response.status === 'queued' || response.status === 'in_progress') {
        if (Date.now() / 1000 - response.created_at > GIVE_UP_AFTER_S) throw new NonRetriableError(`${responseId} did not finish within an hour`);
        ctx.snooze(POLL_EVERY_MS);
      }
      if (response.status !== 'completed') throw new NonRetriableError(`${responseId} ended ${response.status}`);
      const html = (response.output ?? []).flatMap((o) => o.content.map((c) => c.text)).join('');
      await savePage(pageId, html);
      return { pageId, bytes: html.length };
    },
  });

  const startPage = defineTask({
    name: 'start-page',
    input: z.object({ pageId: z.string(), prompt: z.string() }),
    timeoutMs: 5_000,
    async run({ pageId, prompt }, ctx) {
      const res = await fetch(`${provider.url}/v1/responses`, {
        method: 'POST',
        headers,
        body: JSON.stringify({ model: 'gpt-5', input: prompt, background: true, metadata: { pageId } }),
        signal: ctx.signal,
      });
      if (res.status >= 400 && res.status < 500 && res.status !== 429) throw new NonRetriableError(`starting page ${pageId}: HTTP ${res.status}`);
      if (!res.ok) throw new Error(`starting page ${pageId}: HTTP ${res.status}`);
      const { id } = (await res.json()) as { id: string };
      ctx.spawn('callback', waitFor(`openai:${id}`, { timeoutMs: CALLBACK_TIMEOUT_MS, onTimeout: { value: null } }));
      ctx.spawn('store', step(storePage, { pageId, responseId: id }, { after: ['callback'] }));
      return { responseId: id };
    },
  });

  return { startPage, storePage, tasks: [startPage, storePage] };
}

/** Starts building a page, in the caller's transaction. */
export function buildPage(tx: Transactional, tasks: ReturnType<typeof pageTasks>, pageId: string, prompt: string) {
  return startRun(tx, `page ${pageId}`, { start: step(tasks.startPage, { pageId, prompt }) });
}

/** The provider's webhook as a signal: a response that ended, keyed by its id; any other event is not waited for. */
export function responseSignal({ body }: { body: unknown }): { key: string; payload: unknown } | null {
  const event = body as { type?: unknown; data?: { id?: unknown } } | null;
  if (typeof event?.type !== 'string' || !/^response\.(completed|failed|cancelled|incomplete)$/.test(event.type)) return null;
  if (typeof event.data?.id !== 'string') return null;
  return { key: `openai:${event.data.id}`, payload: { type: event.type } };
}
