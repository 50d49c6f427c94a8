/**
 * `outlive`: the portable core. Define tasks, write them in the caller's
 * transaction, run passes, and steer runs, on any runtime with `fetch`,
 * Web Crypto and a Postgres pool (Node, Workers without `nodejs_compat`,
 * Vercel). It imports neither `pg` nor any Node built-in; what needs Node
 * (migrate, the LISTEN worker) is `outlive/node`, and the platforms'
 * handlers are `outlive/cloudflare`, `outlive/vercel` and `outlive/dashboard`.
 *
 * This file is the public door; everything else is internal.
 */

// Defining tasks and runs.
export { defineTask } from './model/task.js';
export type { Task, TaskConfig, TaskContext, TaskHandler, TaskInput, TaskOutput, RetryPolicy, AnyTask, TaskList } from './model/task.js';
export type { InputSchema } from './model/input-schema.js';
export type { BackoffOptions } from './model/backoff.js';
export { step } from './model/step.js';
export type { Step, StepOptions } from './model/step.js';
export { waitFor, sleepStep, WaitTimeoutError, DEFAULT_WAIT_TIMEOUT_MS, MAX_WAIT_MS } from './model/wait.js';
export type { WaitForOptions, WaitStepOptions } from './model/wait.js';
export { TASK_STATES, RUN_STATES } from './model/states.js';
export type { TaskState, RunState } from './model/states.js';
export {
  OutliveError,
  InvalidEnqueueError,
  InvalidGraphError,
  UnknownTaskError,
  ConfigError,
  NonRetriableError,
  RetryAfterError,
  RateLimitedError,
  SnoozeError,
} from './model/errors.js';
export { MAX_INPUT_BYTES } from './model/row.js';
export type { EnqueueOptions, EnqueueManyOptions } from './model/row.js';

// Writing them, in the caller's transaction.
export { enqueue, enqueueMany } from './write/enqueue.js';
export type { EnqueuedTask } from './write/enqueue.js';
export { startRun } from './write/start-run.js';
export type { StartedRun } from './write/start-run.js';
export { batchEnqueue, enqueuedFrom } from './write/batch.js';
export { signal, signalSql, batchSignal, InvalidSignalError, DEFAULT_SIGNAL_KEEP_MS } from './write/signal.js';
export type { SignalOptions, SignalResult } from './write/signal.js';
export type { BatchingDatabase } from './write/batch.js';
export { neonPool } from './db/neon.js';
export type { NeonPoolOptions } from './db/neon.js';
export type { Transactional, Database } from './db/executor.js';
export type { PreparedStatements } from './db/statements.js';

// Passes: claim, run, settle, recover.
export { tick, PassError, LeaseLostError } from './pass/tick.js';
export type { TickOptions, TickReport } from './pass/tick.js';
export { recover } from './pass/recover.js';
export type { RecoverReport } from './pass/recover.js';
export { MAX_OUTPUT_BYTES, TaskTimeoutError, HandBackError } from './pass/execute.js';
export type { ErrorEntry } from './pass/execute.js';

// Recurring work.
export { defineSchedule, enqueueDue, isSchedule, ScheduleError, MAX_CATCH_UP } from './maintenance/schedule.js';
export type { Schedule, ScheduleConfig, AnySchedule, MissedPolicy, EnqueueDueOptions, EnqueueDueReport, FiredSlot } from './maintenance/schedule.js';
export { applyRetention } from './maintenance/retention.js';
export type { RetentionOptions, RetentionReport } from './maintenance/retention.js';

// Steering and asking why.
export { setLimit, pauseKey, resumeKey, pauseQueue, resumeQueue, setWeight, limitStatus, FlowControlError } from './admin/flow.js';
export type { LimitOverride, LimitStatus } from './admin/flow.js';
export type { Limit, Fairness, KeyOf } from './model/limits.js';
export { cancelRun } from './admin/cancel.js';
export type { CancelReport } from './admin/cancel.js';
export { retryRun, retryTask } from './admin/retry.js';
export type { RetryReport } from './admin/retry.js';
export { explainRun } from './admin/explain.js';
export type { ExplainedRun, ExplainedTask } from './admin/explain.js';
export { metricsSnapshot } from './admin/metrics.js';
export type { MetricsSnapshot, MetricsOptions, QueueMetrics, DepthState, FinishedState, Quantiles } from './admin/metrics.js';
export { prometheusText, PROMETHEUS_CONTENT_TYPE } from './admin/prometheus.js';

// Observing it: the hook outlive/otel fills with OpenTelemetry, or an app's own observer.
export { setTelemetry, telemetry } from './model/telemetry.js';
export type {
  Telemetry,
  SendInfo,
  SendSpan,
  PassSpan,
  AttemptSpan,
  SettleSpan,
  WaitsSpan,
  AttemptInfo,
  AttemptDetail,
  AttemptEnd,
  AttemptRecord,
  AttemptOutcome,
  SignalRecord,
  TelemetryError,
} from './model/telemetry.js';

// Waking a drain endpoint right after enqueue.
export { nudge, signNudge, verifyNudge, checkSecret, SIGNATURE_HEADER, DEFAULT_TOLERANCE_MS, MIN_SECRET_LENGTH } from './http/nudge.js';
export type { NudgeOptions, NudgeResult, SignOptions, SignedRequest, VerifyOptions, Verification, RejectReason } from './http/nudge.js';
