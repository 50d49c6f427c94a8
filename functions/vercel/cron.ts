/** Vercel's cron route: `GET /api/cron` with `Authorization: Bearer <CRON_SECRET>`. */
import { createCronRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

/** Runs the cron tick (recovery, schedules, retention, then a bounded pass). */
export const GET = createCronRoute(tasks);
