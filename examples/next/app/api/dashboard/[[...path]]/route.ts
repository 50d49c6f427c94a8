// /api/dashboard and every page below it, behind OUTLIVE_DASHBOARD_TOKEN.
import { createDashboardRoute } from 'outlive/vercel';
import { tasks } from '@/lib/tasks';

const dashboard = createDashboardRoute(tasks, { basePath: '/api/dashboard' });
export { dashboard as GET, dashboard as POST };
