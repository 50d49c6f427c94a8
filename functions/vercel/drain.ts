/** Vercel's drain route: `POST /api/drain`, signed by the app's nudge. */
import { createDrainRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

/** Verifies the nudge's signature, then runs a bounded pass. */
export const POST = createDrainRoute(tasks);
