/**
 * The Cloudflare Worker (`main` in wrangler.toml): `outlive/cloudflare`'s
 * handlers running this deployment's tasks. Its cron triggers are declared in
 * wrangler.toml; `POST /drain` is the nudge's webhook, `/dashboard` the pages.
 */
import { createCloudflareWorker } from 'outlive/cloudflare';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks);
