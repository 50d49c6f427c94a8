/** The Vercel routes' suite (`vercel-suite.ts`) with node-postgres, the default on the Node.js runtime. */
import { vercelSuite } from './vercel-suite.js';

await vercelSuite('pg');
