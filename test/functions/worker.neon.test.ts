/** The Worker's suite (`worker-suite.ts`) with Neon's WebSocket driver through a proxy (`functions/cloudflare-neon.ts`, no `nodejs_compat`). */
import { workerSuite } from './worker-suite.js';

await workerSuite('neon');
