/**
 * Vercel's cron route: `GET /api/cron` with `Authorization: Bearer <CRON_SECRET>`.
 * vercel.json fires it once a day, which deploys on the Hobby plan; on Pro,
 * make its schedule `* * * * *` (docs/deploy.md).
 */
import { createCronRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

/** Runs the cron tick (recovery, schedules, retention, then a bounded pass). */
export const GET = createCronRoute(tasks);
