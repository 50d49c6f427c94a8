/**
 * Vercel's dashboard route: `GET /api/dashboard` (and its pages below it),
 * `POST` for its actions, behind `OUTLIVE_DASHBOARD_TOKEN`. vercel.json routes
 * every `/api/dashboard/*` path here (see docs/operations.md).
 */
import { createDashboardRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

const route = createDashboardRoute(tasks);
/** The dashboard's pages. */
export const GET = route;
/** The dashboard's actions (retry, cancel). */
export const POST = route;
