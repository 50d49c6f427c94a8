/** Shared shapes of rows as the engine reads them. */

/** The states a task passes through; see `db/schema.ts`. */
export type TaskState = 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled' | 'skipped';

/** The states of a run. */
export type RunState = 'running' | 'succeeded' | 'failed' | 'cancelled';
