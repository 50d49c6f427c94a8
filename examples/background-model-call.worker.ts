/**
 * The Worker that runs examples/background-model-call.ts: its cron and drain
 * passes run the page tasks, and `POST /signal` takes the provider's
 * webhooks (Standard Webhooks, `OUTLIVE_SIGNAL_SECRETS`) as signals for the
 * waits. Pages go to the app's own `pages` table, on the invocation's pool.
 */
import { createCloudflareWorker } from 'outlive/cloudflare';
import { pageTasks, responseSignal } from './background-model-call.js';

export default createCloudflareWorker(
  ({ env, pool }) =>
    pageTasks({ url: String(env.MODEL_URL), apiKey: String(env.MODEL_API_KEY) }, async (pageId, html) => {
      await pool.query('INSERT INTO pages (id, html) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET html = excluded.html', [pageId, html]);
    }).tasks,
  { signals: { toSignal: responseSignal } },
);
