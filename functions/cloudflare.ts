/**
 * The Cloudflare Worker (`main` in wrangler.toml): `outlive/cloudflare`'s
 * handlers running this deployment's tasks. Its cron triggers are declared in
 * wrangler.toml; `POST /drain` is the nudge's webhook, `POST /signal` the
 * endpoint providers' webhooks (Standard Webhooks) send signals to, and
 * `/dashboard` the pages.
 *
 * It reaches Postgres with node-postgres through the Hyperdrive binding
 * `HYPERDRIVE` (wrangler.toml; `nodejs_compat`), which any Postgres can sit
 * behind; `wrangler dev` connects it to a local database. For Neon's driver
 * and no `nodejs_compat`, see `cloudflare-neon.ts`.
 */
import pg from 'pg';
import { createCloudflareWorker } from 'outlive/cloudflare';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks, { pg });
