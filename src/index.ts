/**
 * outlive: durable jobs and DAG runs for serverless TypeScript, kept in
 * Postgres rows. This file is the public door; everything else is internal.
 */
export { defineTask } from './task.js';
export type { Task, TaskConfig, TaskContext, TaskHandler, TaskInput, TaskOutput, RetryPolicy, AnyTask, TaskList } from './task.js';
export type { BackoffOptions } from './backoff.js';
export { enqueue, enqueueMany, MAX_INPUT_BYTES } from './enqueue.js';
export type { EnqueueOptions, EnqueueManyOptions, EnqueuedTask } from './enqueue.js';
export { startRun, step } from './runs.js';
export type { Step, StepOptions, StartedRun } from './runs.js';
export { cancelRun } from './cancel.js';
export type { CancelReport } from './cancel.js';
export { explainRun } from './explain.js';
export { retryRun, retryTask } from './retry.js';
export type { RetryReport } from './retry.js';
export type { ExplainedRun, ExplainedTask } from './explain.js';
export { tick, PassError, LeaseLostError } from './tick.js';
export type { TickOptions, TickReport } from './tick.js';
export { recover } from './recover.js';
export type { RecoverReport } from './recover.js';
export { migrate } from './migrate.js';
export { MAX_OUTPUT_BYTES, TaskTimeoutError, HandBackError } from './execute.js';
export type { ErrorEntry } from './execute.js';
export {
  OutliveError,
  InvalidEnqueueError,
  InvalidGraphError,
  UnknownTaskError,
  ConfigError,
  NonRetriableError,
  RetryAfterError,
} from './errors.js';
export type { Transactional, Database, Executor } from './executor.js';
export { toExecutor } from './executor.js';
export type { TaskState, RunState } from './types.js';

// Event tick and recurring work (issue 5)
export { defineSchedule, enqueueDue, isSchedule, ScheduleError, MAX_CATCH_UP } from './schedule.js';
export type { Schedule, ScheduleConfig, AnySchedule, MissedPolicy, EnqueueDueOptions, EnqueueDueReport, FiredSlot } from './schedule.js';
export { applyRetention } from './retention.js';
export type { RetentionOptions, RetentionReport } from './retention.js';
export { createWorker } from './worker.js';
export type { Worker, WorkerOptions, WorkerStats, WorkerLogger, StopOptions } from './worker.js';

// Serverless functions (issue 4)
export { neonPool } from './neon.js';
export type { NeonPoolOptions } from './neon.js';
export {
  nudge,
  signNudge,
  verifyNudge,
  verifySignature,
  useNonce,
  rejectStatus,
  secretsEqual,
  checkSecret,
  SIGNATURE_HEADER,
  DEFAULT_TOLERANCE_MS,
  MIN_SECRET_LENGTH,
} from './nudge.js';
export type { NudgeOptions, NudgeResult, SignOptions, VerifyOptions, Verification, RejectReason } from './nudge.js';
export { batchEnqueue, enqueueSql, enqueuedFrom } from './batch.js';
export type { BatchingDatabase } from './batch.js';

// Dashboard (issue 6)
export { handleDashboard, MIN_TOKEN_LENGTH } from './dashboard/index.js';
export type { DashboardOptions } from './dashboard/index.js';
