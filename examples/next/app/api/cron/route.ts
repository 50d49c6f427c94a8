// GET /api/cron: Vercel Cron calls it with `Authorization: Bearer $CRON_SECRET` (vercel.json).
import { createCronRoute } from 'outlive/vercel';
import { tasks } from '@/lib/tasks';

export const maxDuration = 60;
export const GET = createCronRoute(tasks);
