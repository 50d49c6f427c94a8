/** The Worker's suite (`worker-suite.ts`) with node-postgres through a Hyperdrive binding (`functions/cloudflare.ts`, `nodejs_compat`). */
import { workerSuite } from './worker-suite.js';

await workerSuite('hyperdrive');
