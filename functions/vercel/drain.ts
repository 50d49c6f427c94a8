/**
 * Vercel's drain route: `POST /api/drain`, signed by the app's nudge. It
 * answers a nudge at once and runs the pass in Vercel's `waitUntil`, from
 * `@vercel/functions` (a dependency of the app that deploys it).
 */
import { createDrainRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

/** Verifies the nudge's signature, then runs a bounded pass. */
export const POST = createDrainRoute(tasks);
