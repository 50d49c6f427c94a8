import { defaultClientConditions, defaultServerConditions } from 'vite';
import { defineConfig } from 'vitest/config';

// `outlive/...` imports (the example functions, the examples) resolve to the
// sources here, through the condition package.json's exports give them.
const SOURCE = 'outlive-source';

export default defineConfig({
  resolve: { conditions: [SOURCE, ...defaultClientConditions] },
  // Without `module`: OpenTelemetry's packages give under it an ESM build
  // that Node cannot load (extensionless imports); Node's own resolution
  // (`default`, their CommonJS build) is what an app on Node gets too.
  ssr: { resolve: { conditions: [SOURCE, ...defaultServerConditions.filter((c) => c !== 'module')], externalConditions: [SOURCE] } },
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
