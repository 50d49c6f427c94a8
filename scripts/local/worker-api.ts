/**
 * What the site-import example imports from `outlive`, without the parts
 * that need Node (migrate, the worker): the local Worker's bundle maps the
 * example's `../src/index.js` here, as an app would import from a
 * Worker-safe entry.
 */
export { defineTask } from '../../src/task.js';
export { NonRetriableError } from '../../src/errors.js';
export { startRun, step } from '../../src/runs.js';
export type { Transactional } from '../../src/executor.js';
