// POST /api/drain: the signed nudge the app sends after a commit that enqueued work.
import { createDrainRoute } from 'outlive/vercel';
import { tasks } from '@/lib/tasks';

export const maxDuration = 60;
export const POST = createDrainRoute(tasks);
