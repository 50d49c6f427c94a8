/**
 * The Cloudflare Worker (`main` in wrangler.toml): the handlers of
 * `cloudflare-handlers.ts`, running the app's tasks. Its cron triggers are
 * declared in wrangler.toml; `POST /drain` is the nudge's webhook.
 */
import { createCloudflareWorker } from './cloudflare-handlers.js';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks);
