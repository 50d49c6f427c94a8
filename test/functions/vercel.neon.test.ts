/** The Vercel routes' suite (`vercel-suite.ts`) with Neon's WebSocket driver through a proxy. */
import { vercelSuite } from './vercel-suite.js';

await vercelSuite('neon');
