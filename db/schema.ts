/**
 * The rows that hold every piece of outlive's state.
 *
 * Everything lives in its own Postgres schema, `outlive`, so it never collides
 * with the application's tables and can be dropped as a unit. Migrations in
 * `db/migrations` are generated from this file by drizzle-kit
 * (`npm run db:generate`) and applied by `migrate()`.
 */
import { sql } from 'drizzle-orm';
import {
  bigint,
  doublePrecision,
  bigserial,
  check,
  index,
  integer,
  jsonb,
  pgSchema,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
} from 'drizzle-orm/pg-core';

import { RUN_STATES, TASK_STATES } from '../src/model/states.js';

export const outlive = pgSchema('outlive');

/** The life of a task and of a run: one list each, in src/model/states.ts. */
export const taskState = outlive.enum('task_state', TASK_STATES);

export const runState = outlive.enum('run_state', RUN_STATES);

/** One error of one attempt, as kept in `tasks.errors`. */
export interface TaskErrorEntry {
  attempt: number;
  at: string;
  message: string;
  name?: string;
  stack?: string;
}

export const runs = outlive.table(
  'runs',
  {
    id: bigserial('id', { mode: 'bigint' }).primaryKey(),
    name: text('name').notNull(),
    state: runState('state').notNull().default('running'),
    /** Tasks of the run not yet in a final state; the run settles when it reaches 0. */
    unfinished: integer('unfinished').notNull().default(0),
    /** The first task that failed for good, which made the run fail. */
    failedTaskId: bigint('failed_task_id', { mode: 'bigint' }),
    error: text('error'),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
    finishedAt: timestamp('finished_at', { withTimezone: true }),
  },
  (t) => [index('runs_created_idx').on(t.createdAt)],
);

export const tasks = outlive.table(
  'tasks',
  {
    id: bigserial('id', { mode: 'bigint' }).primaryKey(),
    name: text('name').notNull(),
    queue: text('queue').notNull().default('default'),
    state: taskState('state').notNull().default('pending'),
    /** Higher runs first. */
    priority: integer('priority').notNull().default(0),
    input: jsonb('input').notNull(),
    output: jsonb('output'),
    /** Attempts started so far (a claim counts one). */
    attempts: integer('attempts').notNull().default(0),
    /** The attempts it may start: as declared, plus one for each interruption and each snooze (attempts not spent). */
    maxAttempts: integer('max_attempts').notNull(),
    /** Attempts cut short by their pass (it died or lost its lease), not by the handler: counted apart from maxAttempts. */
    interruptions: integer('interruptions').notNull().default(0),
    /** Attempts that said "not yet" (SnoozeError): counted apart from maxAttempts. */
    snoozes: integer('snoozes').notNull().default(0),
    /** What the running attempt last said of its progress (`ctx.progress`): `{ done?, total?, note?, at }`. */
    progress: jsonb('progress'),
    /** When the task may next be claimed: its first run, or its next attempt. */
    runAt: timestamp('run_at', { withTimezone: true }).notNull().defaultNow(),
    /** How long one attempt may take before its AbortSignal fires. */
    timeoutMs: integer('timeout_ms').notNull(),
    leaseOwner: text('lease_owner'),
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }),
    /** Idempotency key, unique per task name among unfinished tasks. */
    key: text('key'),
    lastError: text('last_error'),
    errors: jsonb('errors').$type<TaskErrorEntry[]>().notNull().default(sql`'[]'::jsonb`),
    runId: bigint('run_id', { mode: 'bigint' }).references(() => runs.id, { onDelete: 'cascade' }),
    /** The task's name within its run (unique per run), used to wire dependencies. */
    step: text('step'),
    /** Dependencies not yet succeeded; the task is claimable only at 0. */
    waitingOn: integer('waiting_on').notNull().default(0),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
    startedAt: timestamp('started_at', { withTimezone: true }),
    finishedAt: timestamp('finished_at', { withTimezone: true }),
    // Flow control (issue 26, docs/flow-control.md). A task with limits or
    // fairness has a fair_key ('' when it has limits only): such rows are
    // claimed by outlive.claim_governed, the others by the plain claim.
    /** The fairness key its queue's turns are taken by. */
    fairKey: text('fair_key'),
    /** Its place in its queue's turns; null until placed (ready, the claim or enqueue places it). */
    vt: doublePrecision('vt'),
    /** The limits its starts count against: `[{ k, n?, r?, p?, c? }]` (src/model/limits.ts). */
    limits: jsonb('limits'),
    /** The key whose limit it was last found waiting for; it is out of the claim's way until that key wakes. */
    blockedOn: text('blocked_on'),
    // Waits (issue 27): a step made by waitFor or sleepStep is a row of the
    // built-in task '$wait' (src/model/wait.ts). Parked, it is pending with
    // run_at at its deadline, so the claim finds it when it is due and
    // nothing reads or writes it before.
    /** The signal key a parked wait listens for; null for a sleep and for every other task. */
    waitKey: text('wait_key'),
    /** When the wait ends without its signal: set when it first parks. */
    waitUntil: timestamp('wait_until', { withTimezone: true }),
    /** The signal that ended the wait, `{ id, payload }`, written by `outlive.send_signal` or when it parks. */
    signal: jsonb('signal'),
    /**
     * The W3C trace context of the enqueue that wrote it (`traceparent`, then
     * a newline and `tracestate` if any), its attempts' spans link to; null
     * when no telemetry was registered (src/model/telemetry.ts). A run's
     * steps carry the run's, so a long run is many small traces.
     */
    traceContext: text('trace_context'),
  },
  (t) => [
    // The claim reads only this index: ready rows, in claim order. Finished
    // rows are not in it, so history can pile up without slowing the claim.
    index('tasks_claim_idx')
      .on(t.priority.desc(), t.runAt, t.id)
      .where(sql`${t.state} = 'pending' AND ${t.waitingOn} = 0 AND ${t.fairKey} IS NULL`),
    // The governed claim's order: priority, then turn. Rows waiting for a
    // key are out of it, so a claim reads what it may start, not the backlog
    // behind a full limit.
    index('tasks_governed_idx')
      .on(t.priority.desc(), t.vt, t.id)
      .where(sql`${t.state} = 'pending' AND ${t.waitingOn} = 0 AND ${t.fairKey} IS NOT NULL AND ${t.vt} IS NOT NULL AND ${t.blockedOn} IS NULL`),
    // A fairness key's last turn, and a queue's first (outlive.fair_start).
    // The key's index leaves rows unplaced (vt null) in, last in its order,
    // so the key's probe cannot be answered from the queue's head index: a
    // generic plan that guessed one key held the whole backlog walked all of
    // another key's rows there on every enqueue (migration 0020).
    index('tasks_fair_key_last_idx')
      .on(t.queue, t.fairKey, t.vt.desc().nullsLast())
      .where(sql`${t.state} = 'pending' AND ${t.fairKey} IS NOT NULL`),
    index('tasks_fair_head_idx')
      .on(t.queue, t.vt)
      .where(sql`${t.state} = 'pending' AND ${t.fairKey} IS NOT NULL AND ${t.vt} IS NOT NULL`),
    // Governed rows that became ready (their time came, a retry, a
    // dependency succeeded) and wait to be placed in turn.
    index('tasks_unplaced_idx')
      .on(t.runAt, t.id)
      .where(sql`${t.state} = 'pending' AND ${t.waitingOn} = 0 AND ${t.fairKey} IS NOT NULL AND ${t.vt} IS NULL`),
    // Rows waiting for a key, woken in the claim's order (priority, then
    // turn) when it frees.
    index('tasks_blocked_idx')
      .on(t.blockedOn, t.priority.desc(), t.vt, t.id)
      .where(sql`${t.state} = 'pending' AND ${t.blockedOn} IS NOT NULL`),
    // Running rows by lease owner. A settle and a heartbeat name their
    // pass's owner and read only that pass's rows here; recovery reads the
    // whole index (running rows only) for expired leases, without touching
    // a heap row that has not expired. Keyed by expiry alone (0000-0007), the
    // index gave settles a path whose cost grew with every pass's running
    // rows: planned on statistics from a quieter moment (or cached as a
    // generic plan), a settle of one task read all of them, 1.3 ms each with
    // 10,000 rows running elsewhere and 5.6 ms with 50,000, against 0.25-0.36
    // ms with this key (2 cores, PostgreSQL 15). All rows of one claim share
    // owner and expiry, so their entries deduplicate into one posting list.
    index('tasks_lease_idx').on(t.leaseOwner, t.leaseExpiresAt).where(sql`${t.state} = 'running'`),
    // Idempotency: one unfinished task per (name, key). Enqueue's ON CONFLICT
    // names this predicate.
    uniqueIndex('tasks_key_idx')
      .on(t.name, t.key)
      .where(sql`${t.key} IS NOT NULL AND ${t.state} IN ('pending', 'running')`),
    // Steps are unique within a run. Partial, so tasks outside runs (most of
    // a plain queue's rows) have no entry here: every claim and settle of
    // such a task writes a new row version, and a non-partial index took a
    // new entry each time (measured: claim and settle of 100,000 plain tasks
    // in batches of 250, Postgres CPU 41-45 ms per 1,000 tasks with it
    // non-partial, 35-37 ms partial; WAL 1,202 bytes per task, 1,063 partial).
    uniqueIndex('tasks_run_step_idx').on(t.runId, t.step).where(sql`${t.runId} IS NOT NULL`),
    // Retention walks finished rows by age; unfinished rows stay out of this
    // index so the planner never prefers it over the claim index.
    index('tasks_state_finished_idx').on(t.state, t.finishedAt).where(sql`${t.finishedAt} IS NOT NULL`),
    // A release that counted a success off a row twice fails in the
    // statement that does it, instead of leaving a task no claim can match.
    check('tasks_waiting_on_check', sql`${t.waitingOn} >= 0`),
    check('tasks_unspent_attempts_check', sql`${t.interruptions} >= 0 AND ${t.snoozes} >= 0 AND ${t.maxAttempts} - ${t.interruptions} - ${t.snoozes} >= 1`),
    // Limits, a turn and a wait belong to governed rows only: a plain row
    // carrying them would be claimed by a claim that ignores them.
    // Signals reach parked waits through this index (outlive.send_signal).
    index('tasks_wait_idx').on(t.waitKey).where(sql`${t.state} = 'pending' AND ${t.waitKey} IS NOT NULL`),
    check('tasks_wait_check', sql`${t.name} = '$wait' OR (${t.waitKey} IS NULL AND ${t.waitUntil} IS NULL AND ${t.signal} IS NULL)`),
    check('tasks_trace_context_check', sql`pg_catalog.length(${t.traceContext}) <= 1024`),
    check('tasks_governed_check', sql`${t.fairKey} IS NOT NULL OR (${t.limits} IS NULL AND ${t.vt} IS NULL AND ${t.blockedOn} IS NULL)`),
  ],
);

/**
 * One row per limit key: what its tasks hold of it and when it may start
 * more. Taken by the claim (outlive.claim_governed) and given back by the
 * statement that settles, recovers or cancels the task (outlive.release_slots),
 * never by a statement of its own (docs/flow-control.md).
 */
export const limits = outlive.table(
  'limits',
  {
    key: text('key').primaryKey(),
    /** Set at run time (setLimit): overrides what tasks declare; null keeps the declared. */
    concurrency: integer('concurrency'),
    rateLimit: integer('rate_limit'),
    ratePeriodMs: integer('rate_period_ms'),
    /** Tasks of the key running now. */
    running: integer('running').notNull().default(0),
    /** The starts in the current rate window: `[[at_ms, cost, task_id, attempt], ...]`, oldest first. */
    starts: jsonb('starts').notNull().default(sql`'[]'::jsonb`),
    /** No task of the key starts before this (a 429's Retry-After, pauseKey). */
    pausedUntil: timestamp('paused_until', { withTimezone: true }),
    pausedReason: text('paused_reason'),
    /** Who paused it: 'hand' (pauseKey) or '429' (a task's RateLimitedError). */
    pausedBy: text('paused_by'),
    /** When tasks waiting for the key are looked at again; 'infinity': when a slot frees; null: none wait. */
    wakeAt: timestamp('wake_at', { withTimezone: true }),
    /** The concurrency the last claim applied, for how many waiting tasks a freed slot wakes. */
    seenConcurrency: integer('seen_concurrency'),
    updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    index('limits_wake_idx').on(t.wakeAt).where(sql`${t.wakeAt} IS NOT NULL`),
    check('limits_running_check', sql`${t.running} >= 0`),
    check('limits_paused_by_check', sql`${t.pausedBy} IN ('hand', '429')`),
    check('limits_values_check', sql`${t.concurrency} > 0 AND ${t.rateLimit} > 0 AND ${t.ratePeriodMs} > 0 AND (${t.rateLimit} IS NULL) = (${t.ratePeriodMs} IS NULL)`),
  ],
);

/** The weight of a fairness key in its queue (setWeight): a key of weight 3 takes 3 turns to another's 1. */
export const fairness = outlive.table(
  'fairness',
  {
    queue: text('queue').notNull(),
    key: text('key').notNull(),
    weight: doublePrecision('weight').notNull(),
    updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.queue, t.key] }), check('fairness_weight_check', sql`${t.weight} > 0 AND ${t.weight} <= 1000`)],
);

/** Paused queues (pauseQueue): no claim takes their tasks until resumed. */
export const queuePauses = outlive.table('queue_pauses', {
  queue: text('queue').primaryKey(),
  reason: text('reason'),
  pausedAt: timestamp('paused_at', { withTimezone: true }).notNull().defaultNow(),
});

/**
 * Signals (issue 27): one row per (key, id) sent by `signal()`. A signal that
 * found parked waits on its key ended them and is marked consumed; one that
 * found none is kept until `expires_at` for the first wait on its key to
 * take when it begins. Kept past consumption until `expires_at`, so the same
 * id sent again (a webhook redelivered) is known and changes nothing.
 * Written by `outlive.send_signal` and `outlive.begin_waits` (migration
 * 0017), pruned by retention.
 */
export const signals = outlive.table(
  'signals',
  {
    key: text('key').notNull(),
    id: text('id').notNull(),
    payload: jsonb('payload'),
    sentAt: timestamp('sent_at', { withTimezone: true }).notNull().defaultNow(),
    expiresAt: timestamp('expires_at', { withTimezone: true }).notNull(),
    /** When a wait took it; null while it is kept for one. */
    consumedAt: timestamp('consumed_at', { withTimezone: true }),
    /** How many waits it ended. */
    delivered: integer('delivered').notNull().default(0),
  },
  (t) => [
    primaryKey({ columns: [t.key, t.id] }),
    // The kept signals of a key, oldest first: what a wait takes when it begins.
    index('signals_kept_idx').on(t.key, t.sentAt, t.id).where(sql`${t.consumedAt} IS NULL`),
    index('signals_expires_idx').on(t.expiresAt),
    check('signals_delivered_check', sql`${t.delivered} >= 0 AND (${t.consumedAt} IS NULL) = (${t.delivered} = 0)`),
  ],
);

/**
 * `task_id` may start only after `depends_on` has succeeded. Both are steps of
 * `run_id`, and an edge lives as long as its run: it goes with the run, not
 * with either task. Foreign keys from here to outlive.tasks would put two
 * cascade queries on every tasks row deleted (retention's, and the delete
 * that settles a task defined with `keepSucceeded: false`), edges or not:
 * measured on claim-and-settle loops of 100,000 plain tasks, a settle by
 * DELETE cost 8-9 ms of Postgres CPU per 1,000 tasks with them, 2.2-2.7
 * without.
 */
export const taskDeps = outlive.table(
  'task_deps',
  {
    runId: bigint('run_id', { mode: 'bigint' })
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    taskId: bigint('task_id', { mode: 'bigint' }).notNull(),
    dependsOn: bigint('depends_on', { mode: 'bigint' }).notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.taskId, t.dependsOn] }),
    index('task_deps_depends_on_idx').on(t.dependsOn),
    // The cascade from a deleted run finds its edges here.
    index('task_deps_run_idx').on(t.runId),
  ],
);

/**
 * Tasks whose `waiting_on` a spawn could not be sure would be released: they
 * wait for a step that was running in another pass when they were written,
 * whose settle may have been a statement that began before the spawn
 * committed and so cannot see the new edge. Written by spawns
 * (src/pass/run-effects.ts), recounted and cleared by recovery.
 */
export const recounts = outlive.table('recounts', {
  taskId: bigint('task_id', { mode: 'bigint' }).primaryKey(),
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
});

/**
 * One row per pass that holds tasks for longer than a moment: the pass's
 * lease. A running task is held while its own claim-time lease
 * (`tasks.lease_expires_at`) or its pass's lease here has not expired, so a
 * pass keeps 1,000 slow tasks alive by beating this one row, not theirs
 * (docs/benchmarks.md, "Liveness"). Written by the pass's lease watch
 * (src/pass/lease-watch.ts), deleted when the pass ends or by recovery once
 * expired.
 */
export const leases = outlive.table('leases', {
  owner: text('owner').primaryKey(),
  expiresAt: timestamp('expires_at', { withTimezone: true }).notNull(),
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
});

/**
 * The task names passes were given, and when a pass last said so. A pass
 * claims only names it can run, and only tasks whose timeout fits in what is
 * left of its budget; this is how `explainRun`, the CLI and the dashboard
 * tell a ready task nobody can run from one waiting its turn.
 * Written by every pass (src/pass/known-tasks.ts), at most once a minute a name.
 */
export const knownTasks = outlive.table('known_tasks', {
  name: text('name').primaryKey(),
  seenAt: timestamp('seen_at', { withTimezone: true }).notNull(),
  /** The longest timeout a pass that knows the name can claim (its budget less its reserve); null if no pass said (0011 and before). */
  longestMs: integer('longest_ms'),
  /** When a pass last said it could give `longestMs`. */
  longestAt: timestamp('longest_at', { withTimezone: true }),
}, (t) => [
  check('known_tasks_longest_check', sql`(${t.longestMs} IS NULL) = (${t.longestAt} IS NULL) AND ${t.longestMs} > 0`),
]);

// ---------------------------------------------------------------------------
// Recurring work (issue 5): the schedules declared in code, and the slots
// they fired. Written by `enqueueDue` (src/maintenance/schedule.ts), pruned by retention.
// ---------------------------------------------------------------------------

/**
 * One row per schedule declared in code, kept in step with the code by every
 * `enqueueDue`: a new schedule is inserted, a changed cron or time zone
 * recomputes `next_slot`, and a schedule no longer in the code is deleted.
 * The dashboard reads when each schedule last fired and when it fires next.
 */
export const schedules = outlive.table('schedules', {
  name: text('name').primaryKey(),
  cron: text('cron').notNull(),
  /** IANA time zone the cron is read in. */
  timezone: text('timezone').notNull().default('UTC'),
  /** Name of the task each slot enqueues. */
  task: text('task').notNull(),
  /** The earliest slot not yet fired: a tick at or after it has work to do. */
  nextSlot: timestamp('next_slot', { withTimezone: true }).notNull(),
  /** The latest slot that enqueued a task. */
  lastSlot: timestamp('last_slot', { withTimezone: true }),
  /** When the tick that enqueued `last_slot` ran. */
  lastFiredAt: timestamp('last_fired_at', { withTimezone: true }),
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
});

/**
 * One row per (schedule, slot time) that enqueued a task. The primary key is
 * what makes a slot fire exactly once: every tick inserts its slots with
 * ON CONFLICT DO NOTHING in the same transaction as the task rows, so of any
 * number of overlapping ticks only one inserts a given slot and its task.
 */
export const scheduleSlots = outlive.table(
  'schedule_slots',
  {
    schedule: text('schedule').notNull(),
    slot: timestamp('slot', { withTimezone: true }).notNull(),
    /** The task the slot enqueued. No foreign key: retention deletes old tasks, and the slot row must outlive them. */
    taskId: bigint('task_id', { mode: 'bigint' }),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.schedule, t.slot] }),
    // Retention deletes old slots across all schedules, oldest first.
    index('schedule_slots_slot_idx').on(t.slot),
  ],
);

// ---------------------------------------------------------------------------
// Serverless functions (issue 4): nonces of accepted drain requests, so a
// captured signed request cannot be replayed. Read and written by src/http/nudge.ts.
// ---------------------------------------------------------------------------

/**
 * One row per accepted drain request. A row is kept until `expires_at`
 * (its signed timestamp plus twice the tolerance), after which the timestamp
 * alone rejects a replay and the row is pruned by the next accepted request.
 */
export const usedNonces = outlive.table(
  'used_nonces',
  {
    nonce: text('nonce').primaryKey(),
    expiresAt: timestamp('expires_at', { withTimezone: true }).notNull(),
  },
  (t) => [index('used_nonces_expires_idx').on(t.expiresAt)],
);
