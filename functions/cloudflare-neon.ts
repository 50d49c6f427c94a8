/**
 * The same Worker over Neon's WebSocket driver, for a Neon database: it needs
 * no `nodejs_compat` and no Hyperdrive binding, only the secret
 * `DATABASE_URL`. Deploy it instead of `cloudflare.ts` with
 * `npx wrangler deploy functions/cloudflare-neon.ts`.
 */
import { createCloudflareWorker } from 'outlive/cloudflare';
import { tasks } from './tasks.js';

export default createCloudflareWorker(tasks);
