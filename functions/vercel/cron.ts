/** Vercel's cron route: `GET /api/cron` with `Authorization: Bearer <CRON_SECRET>`. */
import { tasks } from '../tasks.js';
import { createCronRoute } from './routes.js';

/** Runs the cron tick (recovery, then a bounded pass) for Vercel Cron. */
export const GET = createCronRoute(tasks);
