import { defaultClientConditions, defaultServerConditions } from 'vite';
import { defineConfig } from 'vitest/config';

// `outlive/...` imports (the example functions, the examples) resolve to the
// sources here, through the condition package.json's exports give them.
const SOURCE = 'outlive-source';

export default defineConfig({
  resolve: { conditions: [SOURCE, ...defaultClientConditions] },
  // Vitest hands these conditions to Node for the packages it does not
  // transform; `module` (a bundler's condition) would give Node builds it
  // cannot load, such as @opentelemetry/api's ESM with extensionless imports.
  ssr: { resolve: { conditions: [SOURCE, ...defaultServerConditions.filter((c) => c !== 'module')], externalConditions: [SOURCE] } },
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
