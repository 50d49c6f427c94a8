/**
 * `outlive/node`: what needs Node.js. `migrate` (node-postgres, the migration
 * files on disk) for a deploy step or the CLI, with `grants`, the privileges
 * each part of an app needs once it has run, and the long-lived worker that
 * LISTENs for enqueues, polls as a safety net, fires schedules and applies
 * retention. The rest of the API is `outlive`.
 */
export { migrate, MIGRATIONS_FOLDER } from './migrate.js';
export type { MigrateOptions, MigrateReport } from './migrate.js';
export { grants } from './grants.js';
export type { GrantRoles } from './grants.js';
export { createWorker } from './worker.js';
export type { Worker, WorkerOptions, WorkerStats, WorkerLogger, StopOptions } from './worker.js';
