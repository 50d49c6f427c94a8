/**
 * Recurring work: schedules declared in code beside their tasks, and the pass
 * that enqueues the slots that are due.
 *
 * Any tick can call {@link enqueueDue}: a Cloudflare scheduled handler, a
 * Vercel cron route, the long-lived worker's own clock, all at once if they
 * like. Each (schedule, slot time) is enqueued exactly once however many ticks
 * overlap or repeat: the slot row's primary key, inserted with ON CONFLICT DO
 * NOTHING in the same transaction as its task row, lets exactly one of them
 * through.
 *
 * The cron is parsed by croner (no dependencies, no Node built-ins, time zones
 * through Intl), so this file runs on Node and in Workers alike.
 */
import { checkName, formatIssues, isWhole } from '../model/checks.js';
import { ASYNC_SCHEMA, ASYNC_SCHEMA_FIX, isInputSchema, validateNow } from '../model/input-schema.js';
import { Cron } from 'croner';
import { enqueue } from '../write/enqueue.js';
import { type EnqueueOptions } from '../model/row.js';
import { ConfigError, OutliveError, toError } from '../model/errors.js';
import { toExecutor, toPool, transaction, type Database, type Executor } from '../db/executor.js';
import type { AnyTask, TaskInput } from '../model/task.js';

/**
 * What to do with slots that passed while no tick ran (the platform skipped
 * ticks, the app was down):
 * - `'latest'` (default): run the latest missed slot once, skip the rest;
 * - `{ catchUp: n }`: run the latest `n` missed slots (oldest first) and skip
 *   any older ones.
 */
export type MissedPolicy = 'latest' | { catchUp: number };

/** Everything `defineSchedule` takes. */
export interface ScheduleConfig<T extends AnyTask> {
  /** Unique among schedules; the key of its row in `outlive.schedules`. */
  name: string;
  /** A cron expression: 5 fields (minute precision), 6 (with seconds first), or a nickname such as `@daily`. */
  cron: string;
  /** IANA time zone the cron is read in, e.g. `Europe/Berlin`. Default `UTC`. */
  timezone?: string;
  /** The task each slot enqueues. */
  task: T;
  /** The task's input, or a function of the slot's time that returns it (checked when the slot fires). */
  input: TaskInput<T> | ((slot: Date) => TaskInput<T>);
  /** Missed-slot policy. Default `'latest'`. */
  missed?: MissedPolicy;
  /** Enqueue options for the slot's task; its `runAt` is always the slot's time. */
  enqueue?: Pick<EnqueueOptions, 'priority' | 'queue' | 'maxAttempts' | 'timeoutMs'>;
}

const SCHEDULE = Symbol.for('outlive.schedule');

/** A defined schedule. Pass the list of them to {@link enqueueDue} (and to the worker). */
export interface Schedule<T extends AnyTask = AnyTask> {
  readonly [SCHEDULE]: true;
  readonly name: string;
  readonly cron: string;
  readonly timezone: string;
  readonly task: T;
  readonly input: TaskInput<T> | ((slot: Date) => TaskInput<T>);
  readonly missed: MissedPolicy;
  readonly enqueue: Pick<EnqueueOptions, 'priority' | 'queue' | 'maxAttempts' | 'timeoutMs'>;
  /** The parsed cron; computes slot times. */
  readonly pattern: Cron;
}

/** Any schedule, whatever its task. */
export type AnySchedule = Schedule<AnyTask>;

/** Largest catch-up a policy may ask for. */
export const MAX_CATCH_UP = 1000;

function invalid(name: string, message: string): never {
  throw new ConfigError(`outlive: schedule ${JSON.stringify(name)}: ${message}`);
}


/** Tells whether a value is a schedule made by {@link defineSchedule}. */
export function isSchedule(value: unknown): value is AnySchedule {
  return typeof value === 'object' && value !== null && (value as { [SCHEDULE]?: unknown })[SCHEDULE] === true;
}

/**
 * Defines a schedule: a cron expression, an optional time zone, the task each
 * slot enqueues and its input (typed from the task's schema).
 *
 * ```ts
 * export const nightlyPurge = defineSchedule({
 *   name: 'purge-deleted-files',
 *   cron: '0 3 * * *',
 *   timezone: 'Europe/Berlin',
 *   task: purgeDeletedFiles,
 *   input: (slot) => ({ deletedBefore: new Date(slot.getTime() - 30 * 86_400_000).toISOString() }),
 * });
 * ```
 *
 * Everything is checked here, so a bad cron, time zone or input fails at
 * startup with a message naming the schedule, not at 3 a.m.
 */
export function defineSchedule<T extends AnyTask>(config: ScheduleConfig<T>): Schedule<T> {
  const name = checkName('schedule', config?.name);
  const task = config.task;
  if (!task || typeof task.name !== 'string' || !isInputSchema(task.input)) {
    invalid(name, 'needs a task made by defineTask() as `task`');
  }
  if (typeof config.cron !== 'string' || config.cron.trim() === '') invalid(name, 'needs a cron expression as `cron`, e.g. "*/15 * * * *"');
  const cron = config.cron.trim();
  const timezone = config.timezone ?? 'UTC';
  let pattern: Cron;
  try {
    // No callback: croner only parses and computes times, it starts no timer.
    pattern = new Cron(cron, { timezone, mode: '5-or-6-parts' });
    // A bad time zone surfaces only when a time is computed.
    if (pattern.nextRun(new Date()) === null) invalid(name, `cron "${cron}" never fires`);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    invalid(name, `cannot read cron "${cron}" in time zone "${timezone}": ${toError(err).message}`);
  }
  const missed = config.missed ?? 'latest';
  if (missed !== 'latest') {
    const n = (missed as { catchUp?: unknown })?.catchUp;
    if (!isWhole(n, { min: 1, max: MAX_CATCH_UP })) {
      invalid(name, `missed must be 'latest' or { catchUp: n } with n a whole number from 1 to ${MAX_CATCH_UP}`);
    }
  }
  if (config.input === undefined) invalid(name, 'needs the task input as `input` (a value, or a function of the slot time)');
  if (typeof config.input !== 'function') {
    const result = validateNow(task.input, config.input);
    if (result === ASYNC_SCHEMA) invalid(name, `task "${task.name}" cannot be scheduled: ${ASYNC_SCHEMA_FIX}`);
    if (result.issues) invalid(name, `input does not match the schema of task "${task.name}": ${formatIssues(result.issues)}`);
  }
  const { runAt, delayMs, key } = (config.enqueue ?? {}) as EnqueueOptions;
  if (runAt !== undefined || delayMs !== undefined || key !== undefined) {
    invalid(name, 'enqueue options may set priority, queue, maxAttempts and timeoutMs; runAt is always the slot time');
  }
  return Object.freeze({
    [SCHEDULE]: true as const,
    name,
    cron,
    timezone,
    task,
    input: config.input,
    missed: typeof missed === 'string' ? missed : Object.freeze({ catchUp: missed.catchUp }),
    enqueue: Object.freeze({ ...config.enqueue }),
    pattern,
  });
}

/** Slots of a schedule due at `now`: those in [from, now], the latest `limit` of them, oldest first. */
export function dueSlots(schedule: AnySchedule, from: Date, now: Date, limit: number): Date[] {
  if (now < from) return [];
  // croner's previousRuns excludes its reference; +1 ms makes a slot at exactly `now` due.
  const latest = schedule.pattern.previousRuns(limit, new Date(now.getTime() + 1));
  return latest.filter((slot) => slot >= from).reverse();
}

/** The first slot strictly after `after`, or null if the cron never fires again. */
export function nextSlot(schedule: AnySchedule, after: Date): Date | null {
  return schedule.pattern.nextRun(after);
}

// Counting skipped slots walks them one by one (about 30 µs each), so the
// count stops here: a reported 10,000 means "at least".
const SKIP_COUNT_LIMIT = 10_000;

function countBetween(schedule: AnySchedule, from: Date, before: Date): number {
  let n = 0;
  let slot: Date | null = from;
  while (slot && slot < before && n < SKIP_COUNT_LIMIT) {
    n++;
    slot = schedule.pattern.nextRun(slot);
  }
  return n;
}

/** Options of {@link enqueueDue}. */
export interface EnqueueDueOptions {
  /** The time the tick acts at, for tests; default: the database's clock. */
  now?: Date;
  /**
   * Delete rows of schedules that are not in the list. Default true: the list
   * is the complete set for this database, so a schedule removed from the code
   * stops firing at the next tick. Set false where apps with different lists
   * share one database.
   */
  prune?: boolean;
}

/** One slot a tick enqueued. */
export interface FiredSlot {
  schedule: string;
  slot: Date;
  taskId: string;
}

/** What one {@link enqueueDue} did. */
export interface EnqueueDueReport {
  /** The time it acted at. */
  now: Date;
  /** Slots enqueued by this call, oldest first per schedule. */
  enqueued: FiredSlot[];
  /** Missed slots skipped under their schedule's policy (counted up to 10,000 per schedule). */
  skipped: number;
  /** Schedules seen for the first time (they fire from their first slot after `now`). */
  added: string[];
  /** Schedules whose cron, time zone or task changed. */
  changed: string[];
  /** Schedules deleted because they are no longer in the list. */
  removed: string[];
  /** The earliest slot any schedule fires next: a clock can sleep until then. */
  nextSlot: Date | null;
  durationMs: number;
}

/** Thrown when some schedules could not fire; the others did, and `report` says what was done. */
export class ScheduleError extends OutliveError {
  constructor(
    message: string,
    readonly report: EnqueueDueReport,
    readonly failures: { schedule: string; error: Error }[],
  ) {
    super(message, { cause: failures[0]?.error });
  }
}

interface ScheduleRow {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  next_slot: Date;
}

const SELECT_SCHEDULES = `SELECT name, cron, timezone, task, next_slot FROM outlive.schedules`;

// A schedule seen for the first time starts at its first slot after `now`:
// deploying an hourly job at 10:20 does not fire the 10:00 slot. Two ticks
// registering it at once: the second one's insert does nothing.
const INSERT_SCHEDULE = `
INSERT INTO outlive.schedules (name, cron, timezone, task, next_slot, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $6)
ON CONFLICT (name) DO NOTHING`;

// Compare-and-set against the row this tick read: if another tick changed it
// meanwhile, this update matches nothing and the fresh row is read again.
// A changed cron or time zone starts afresh from its first slot after `now`;
// a changed task alone keeps the slot the schedule was waiting for.
const UPDATE_SCHEDULE = `
UPDATE outlive.schedules
SET cron = $2, timezone = $3, task = $4,
    next_slot = CASE WHEN cron OPERATOR(pg_catalog.=) $2 AND timezone OPERATOR(pg_catalog.=) $3 THEN next_slot ELSE $5 END,
    updated_at = $6
WHERE name OPERATOR(pg_catalog.=) $1 AND cron OPERATOR(pg_catalog.=) $7 AND timezone OPERATOR(pg_catalog.=) $8 AND task OPERATOR(pg_catalog.=) $9`;

const DELETE_SCHEDULES = `DELETE FROM outlive.schedules WHERE name OPERATOR(pg_catalog.=) ANY ($1::text[])`;

// Locks the schedule's row for the rest of the firing transaction, so ticks
// that overlap fire a schedule one after the other, each from the row the
// previous one left. The slot rows' primary key, not this lock, is what
// guarantees one task per slot.
const LOCK_SCHEDULE = `
SELECT cron, timezone, next_slot FROM outlive.schedules WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE`;

const INSERT_SLOTS = `
INSERT INTO outlive.schedule_slots (schedule, slot, created_at)
SELECT $1, s, $3 FROM pg_catalog.unnest($2::timestamptz[]) AS s
ON CONFLICT (schedule, slot) DO NOTHING
RETURNING slot`;

const SET_SLOT_TASKS = `
UPDATE outlive.schedule_slots s SET task_id = v.task_id
FROM ROWS FROM (pg_catalog.unnest($2::timestamptz[]), pg_catalog.unnest($3::bigint[])) AS v(slot, task_id)
WHERE s.schedule OPERATOR(pg_catalog.=) $1 AND s.slot OPERATOR(pg_catalog.=) v.slot`;

// Guarded by the next_slot this transaction locked and read.
const ADVANCE_SCHEDULE = `
UPDATE outlive.schedules
SET next_slot = $3,
    last_slot = CASE WHEN $4::timestamptz IS NULL THEN last_slot ELSE greatest(last_slot, $4::timestamptz) END,
    last_fired_at = CASE WHEN $4::timestamptz IS NULL THEN last_fired_at ELSE $5 END,
    updated_at = $5
WHERE name OPERATOR(pg_catalog.=) $1 AND next_slot OPERATOR(pg_catalog.=) $2
RETURNING name`;

function checkList(list: readonly AnySchedule[]): Map<string, AnySchedule> {
  if (!Array.isArray(list)) throw new ConfigError('outlive: enqueueDue takes an array of schedules made by defineSchedule()');
  const byName = new Map<string, AnySchedule>();
  for (const s of list) {
    if (!isSchedule(s)) throw new ConfigError('outlive: enqueueDue takes schedules made by defineSchedule(); got ' + typeof s);
    const seen = byName.get(s.name);
    if (seen && seen !== s) throw new ConfigError(`outlive: two schedules are named "${s.name}": schedule names must be unique`);
    byName.set(s.name, s);
  }
  return byName;
}

function limitOf(policy: MissedPolicy): number {
  return policy === 'latest' ? 1 : policy.catchUp;
}

// The far future stands in for "never again" (a cron pinned to a past year),
// so next_slot can stay NOT NULL and such a schedule simply never comes due.
const NEVER = new Date('9999-12-31T00:00:00Z');

/** Brings `outlive.schedules` in step with the code; returns the rows of the listed schedules. */
async function sync(
  exec: Executor,
  byName: Map<string, AnySchedule>,
  now: Date,
  prune: boolean,
  report: EnqueueDueReport,
): Promise<Map<string, ScheduleRow>> {
  const read = async () => new Map((await exec.query<ScheduleRow>(SELECT_SCHEDULES)).map((r) => [r.name, r]));
  let rows = await read();
  let wrote = false;
  for (const s of byName.values()) {
    const row = rows.get(s.name);
    const first = nextSlot(s, now) ?? NEVER;
    if (!row) {
      await exec.query(INSERT_SCHEDULE, [s.name, s.cron, s.timezone, s.task.name, first, now]);
      report.added.push(s.name);
      wrote = true;
    } else if (row.cron !== s.cron || row.timezone !== s.timezone || row.task !== s.task.name) {
      await exec.query(UPDATE_SCHEDULE, [s.name, s.cron, s.timezone, s.task.name, first, now, row.cron, row.timezone, row.task]);
      report.changed.push(s.name);
      wrote = true;
    }
  }
  if (prune) {
    const gone = [...rows.keys()].filter((name) => !byName.has(name));
    if (gone.length > 0) {
      await exec.query(DELETE_SCHEDULES, [gone]);
      report.removed.push(...gone);
      wrote = true;
    }
  }
  if (wrote) rows = await read();
  return rows;
}


/** Fires the due slots of one schedule in one transaction; returns what it enqueued and skipped. */
async function fire(db: Database, s: AnySchedule, now: Date): Promise<{ fired: FiredSlot[]; skipped: number; next: Date }> {
  return transaction(toPool(db), async (client) => {
    const exec = toExecutor(client);
    const [row] = await exec.query<{ cron: string; timezone: string; next_slot: Date }>(LOCK_SCHEDULE, [s.name]);
    // Gone, or set to another cron by a tick running other code (a deploy in
    // progress): the slots computed here would not be that row's slots.
    if (!row || row.cron !== s.cron || row.timezone !== s.timezone) return { fired: [], skipped: 0, next: row?.next_slot ?? NEVER };
    const from = new Date(row.next_slot);
    if (now < from) return { fired: [], skipped: 0, next: from };
    const slots = dueSlots(s, from, now, limitOf(s.missed));
    const skipped = slots.length > 0 ? countBetween(s, from, slots[0]!) : 0;
    const next = nextSlot(s, now) ?? NEVER;
    const inserted = slots.length === 0 ? [] : await exec.query<{ slot: Date }>(INSERT_SLOTS, [s.name, slots, now]);
    const fired: FiredSlot[] = [];
    // Only the slots this transaction inserted get a task: a slot another
    // tick already inserted conflicts and comes back from nobody.
    for (const { slot } of inserted.sort((a, b) => +new Date(a.slot) - +new Date(b.slot))) {
      const at = new Date(slot);
      const input = typeof s.input === 'function' ? (s.input as (slot: Date) => unknown)(at) : s.input;
      const task = await enqueue(client, s.task, input, { ...s.enqueue, runAt: at });
      fired.push({ schedule: s.name, slot: at, taskId: task.id });
    }
    if (fired.length > 0) {
      await exec.query(SET_SLOT_TASKS, [s.name, fired.map((f) => f.slot), fired.map((f) => f.taskId)]);
    }
    const latest = fired.length > 0 ? fired[fired.length - 1]!.slot : null;
    const advanced = await exec.query(ADVANCE_SCHEDULE, [s.name, from, next, latest, now]);
    // Cannot happen while the row is locked; if it ever did, undo the slots.
    if (advanced.length !== 1) throw new OutliveError(`outlive: schedule "${s.name}" changed under its row lock`);
    return { fired, skipped, next };
  });
}

/**
 * Enqueues every schedule slot that is due, exactly once per (schedule, slot)
 * however many ticks run at the same time, and brings the `outlive.schedules`
 * rows in step with `schedules` (added, changed, removed). Call it from every
 * scheduled tick:
 *
 * ```ts
 * export default {
 *   async scheduled(_event, env) {
 *     await enqueueDue(pool, schedules);
 *     await tick(pool, { tasks });
 *   },
 * };
 * ```
 *
 * A schedule seen for the first time fires from its first slot after that
 * tick. Slots missed while no tick ran follow the schedule's `missed` policy.
 * Each schedule fires in its own transaction; if some fail (their input
 * function threw, or its input failed the schema), the others still fire and
 * a {@link ScheduleError} says which failed.
 */
export async function enqueueDue(
  db: Database,
  schedules: readonly AnySchedule[],
  options: EnqueueDueOptions = {},
): Promise<EnqueueDueReport> {
  const started = performance.now();
  const byName = checkList(schedules);
  const exec = toExecutor(toPool(db));
  // The database's clock by default, the one the task rows' run_at is read by.
  const now = options.now ?? new Date((await exec.query<{ now: Date }>('SELECT pg_catalog.now() AS now'))[0]!.now);
  const report: EnqueueDueReport = { now, enqueued: [], skipped: 0, added: [], changed: [], removed: [], nextSlot: null, durationMs: 0 };
  const rows = await sync(exec, byName, now, options.prune ?? true, report);
  const failures: { schedule: string; error: Error }[] = [];
  let earliest: Date | null = null;
  const consider = (d: Date) => {
    if (d.getTime() < NEVER.getTime() && (earliest === null || d < earliest)) earliest = d;
  };
  for (const s of byName.values()) {
    const row = rows.get(s.name);
    if (!row) continue; // deleted by a concurrent tick of other code
    const waiting = new Date(row.next_slot);
    if (now < waiting || row.cron !== s.cron || row.timezone !== s.timezone) {
      consider(waiting);
      continue;
    }
    try {
      const { fired, skipped, next } = await fire(db, s, now);
      report.enqueued.push(...fired);
      report.skipped += skipped;
      consider(next);
    } catch (err) {
      failures.push({ schedule: s.name, error: toError(err) });
    }
  }
  report.nextSlot = earliest;
  report.durationMs = Math.round(performance.now() - started);
  if (failures.length > 0) {
    const list = failures.map((f) => `"${f.schedule}" (${f.error.message})`).join(', ');
    throw new ScheduleError(`outlive: ${failures.length} schedule(s) could not fire: ${list}`, report, failures);
  }
  return report;
}
