/**
 * Retry or cancel every task a filter matches, in batches: each batch is one
 * guarded statement of retry.ts or cancel.ts, so a task that changed since
 * it was counted is left as it is. The count comes first, so the operator
 * sees how many before anything changes.
 */
import type { Database } from '../db/executor.js';
import type { TaskState } from '../model/states.js';
import { matchingIds, type TaskQuery } from './browse.js';
import { cancelTasks } from './cancel.js';
import { retryTasks } from './retry.js';

/** What a bulk action does to the tasks it matches. */
export type BulkAction = 'retry' | 'cancel';

/** The most tasks one bulk action counts and changes; run it again for more. */
export const BULK_MAX = 10_000;

/** Tasks changed per statement. */
const BATCH = 500;

/** The states an action can change, narrowed to the filter's state: none when they do not meet. */
export function bulkStates(action: BulkAction, state?: TaskState): TaskState[] {
  const can: TaskState[] = action === 'retry' ? ['failed', 'cancelled'] : ['pending', 'running'];
  return state === undefined ? can : can.filter((s) => s === state);
}

// Tasks of runs are cancelled with their run (cancelRun), never one by one: a step cancelled alone would leave its run waiting.
const outsideRuns = (action: BulkAction) => action === 'cancel';

/** How many tasks the action would change, up to {@link BULK_MAX} (`more` when there are more). */
export async function countBulk(db: Database, action: BulkAction, query: TaskQuery): Promise<{ n: number; more: boolean }> {
  const states = bulkStates(action, query.state);
  if (states.length === 0) return { n: 0, more: false };
  const ids = await matchingIds(db, { ...query, state: undefined }, states, { limit: BULK_MAX + 1, outsideRuns: outsideRuns(action) });
  return { n: Math.min(ids.length, BULK_MAX), more: ids.length > BULK_MAX };
}

/** What a bulk action did. */
export interface BulkReport {
  /** Tasks retried (outside runs) or cancelled. */
  changed: number;
  /** Runs retried because tasks of theirs matched (retry only). */
  runs: number;
  /** Matched tasks left as they were: they changed since they were counted. */
  skipped: number;
}

/** Retries or cancels up to {@link BULK_MAX} tasks matching `query`, newest first, {@link BATCH} per statement. */
export async function runBulk(db: Database, action: BulkAction, query: TaskQuery, options: { reason?: string } = {}): Promise<BulkReport> {
  const states = bulkStates(action, query.state);
  const report: BulkReport = { changed: 0, runs: 0, skipped: 0 };
  let before: string | null = null;
  for (let seen = 0; states.length > 0 && seen < BULK_MAX; ) {
    const ids = await matchingIds(db, { ...query, state: undefined }, states, { before, limit: Math.min(BATCH, BULK_MAX - seen), outsideRuns: outsideRuns(action) });
    if (ids.length === 0) break;
    seen += ids.length;
    before = ids.at(-1)!;
    if (action === 'retry') {
      const r = await retryTasks(db, ids);
      report.changed += r.tasks;
      report.runs += r.runs;
      report.skipped += r.skipped;
    } else {
      const r = await cancelTasks(db, ids, { reason: options.reason ?? 'cancelled from the dashboard' });
      report.changed += r.pending + r.running;
      report.skipped += ids.length - r.pending - r.running;
    }
  }
  return report;
}
