/**
 * The states of tasks and runs: one list each, from which the schema's
 * enums (db/schema.ts), the types, the CLI's choices and the dashboard's
 * counts are all made. Each entry says which part of outlive moves a row
 * into the state and which moves it out; every such move is a guarded
 * compare-and-set in the file named (ARCHITECTURE.md lists them).
 */

/** Every task state, in the order a task lives through them. */
export const TASK_STATES = [
  /**
   * Waiting to be claimed: due at `run_at`, and, in a run, once `waiting_on`
   * (its unfinished dependencies) is 0. In: enqueue, startRun, a spawn, a
   * retry's backoff (pass/settle.ts), recovery (pass/recover.ts), a hand-back,
   * retryRun/retryTask (admin/retry.ts). Out: a claim (pass/claim.ts), a
   * cancel (admin/cancel.ts), a skip downstream of a failure (pass/run-effects.ts).
   */
  'pending',
  /**
   * Claimed by a pass that holds it (`lease_owner`) until the later of its
   * own claim-time lease (`lease_expires_at`) and its pass's lease
   * (`outlive.leases`). In: a claim. Out: the pass's settle, recovery once
   * both expired, a cancel.
   */
  'running',
  /** Final: an attempt returned; its output is kept (or the row deleted, for `keepSucceeded: false`). In: a settle. */
  'succeeded',
  /** Final: the last attempt failed, or one threw NonRetriableError. In: a settle, recovery. Out: a retry by hand. */
  'failed',
  /** Final: its run was cancelled, or it was cancelled by hand outside a run. In: cancelRun, cancelTasks (admin/cancel.ts). Out: retryRun, retryTask(s). */
  'cancelled',
  /** Final, never run: a task it waits for failed, or it was born downstream of one. In: a settle's run effects. Out: retryRun. */
  'skipped',
] as const;

/** The state of a task row. */
export type TaskState = (typeof TASK_STATES)[number];

/** Every run state. */
export const RUN_STATES = [
  /** Until its last task is final. In: startRun, retryRun. */
  'running',
  /** Every task succeeded. In: the settle that finished its last task. */
  'succeeded',
  /** A task failed for good; the others are final. In: the settle that finished its last task. Out: retryRun. */
  'failed',
  /** Cancelled by hand. In: cancelRun. Out: retryRun. */
  'cancelled',
] as const;

/** The state of a run row. */
export type RunState = (typeof RUN_STATES)[number];

/** The final task states. */
export const FINAL_TASK_STATES: readonly TaskState[] = ['succeeded', 'failed', 'cancelled', 'skipped'];
