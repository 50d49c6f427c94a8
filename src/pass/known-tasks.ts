/**
 * Known tasks: the task names passes were given, when a pass last said so,
 * and the longest timeout such a pass can claim. A pass claims only the names
 * it has handlers for, and only tasks whose timeout fits in what is left of
 * its budget, so a task that no deployed pass knows, or one longer than any
 * of them can give, stays pending; these rows let `explainRun`, the CLI and
 * the dashboard say so instead of "waiting for a pass to claim it".
 */
import type { Executor } from '../db/executor.js';

/** How stale a name's `seen_at` may be while the passes that know it still run: announcing is throttled to this. */
export const ANNOUNCE_EVERY_MS = 60_000;

// One statement per pass; a name whose row is less than a minute old is not
// written again, so a busy worker or a cron every few seconds adds no writes.
// The longest timeout kept is the largest any pass said within two minutes:
// a cron pass of 30 s announcing after a worker of 5 minutes must not make
// the worker's long tasks look unrunnable, and the worker refreshes its word
// once a minute. Past that, the worker is taken to be gone.
// A pass's word on the longest replaces the stored one when there is none,
// when it is as long or longer, or when the stored one is two minutes old.
const TAKES_OVER = `(k.longest_ms IS NULL OR excluded.longest_ms OPERATOR(pg_catalog.>=) k.longest_ms
                      OR k.longest_at OPERATOR(pg_catalog.<)
                         (excluded.seen_at OPERATOR(pg_catalog.-) ((2 OPERATOR(pg_catalog.*) $3) OPERATOR(pg_catalog.*) interval '1 millisecond')))`;
const ANNOUNCE_SQL = `
INSERT INTO outlive.known_tasks AS k (name, seen_at, longest_ms, longest_at)
SELECT n, coalesce($2::timestamptz, pg_catalog.now()), $4, coalesce($2::timestamptz, pg_catalog.now()) FROM pg_catalog.unnest($1::text[]) AS n
ON CONFLICT (name) DO UPDATE SET
  seen_at = excluded.seen_at,
  longest_ms = CASE WHEN ${TAKES_OVER} THEN excluded.longest_ms ELSE k.longest_ms END,
  longest_at = CASE WHEN ${TAKES_OVER} THEN excluded.seen_at ELSE k.longest_at END
WHERE k.seen_at OPERATOR(pg_catalog.<) (excluded.seen_at OPERATOR(pg_catalog.-) ($3 OPERATOR(pg_catalog.*) interval '1 millisecond'))
   OR k.longest_ms IS NULL OR excluded.longest_ms OPERATOR(pg_catalog.>) k.longest_ms
   OR (excluded.longest_ms OPERATOR(pg_catalog.=) k.longest_ms
       AND k.longest_at OPERATOR(pg_catalog.<) (excluded.seen_at OPERATOR(pg_catalog.-) ($3 OPERATOR(pg_catalog.*) interval '1 millisecond')))`;

// When this process last announced each name, per pool: a long-lived worker
// runs a pass per wake-up, and even a statement that writes nothing locks the
// rows it matches (a WAL record each), so it is not sent more often than the
// rows are refreshed.
const announced = new WeakMap<object, Map<string, number>>();

/** The largest timeout a known_tasks row can hold (an integer column). */
const LONGEST_STORED_MS = 2_147_483_647;

/**
 * Records that a pass running now knows these task names, and can claim a
 * task of them whose timeout is at most `longestMs`. `pool` keys what this
 * process announced lately; with `now` given (tests backdating), every call
 * is sent.
 */
export async function announceTasks(db: Executor, names: readonly string[], longestMs: number, now: Date | null, pool?: object): Promise<void> {
  const at = performance.now();
  const mine = pool && now === null ? (announced.get(pool) ?? announced.set(pool, new Map()).get(pool)!) : null;
  const due = mine ? names.filter((n) => at - (mine.get(n) ?? -Infinity) >= ANNOUNCE_EVERY_MS / 2) : names;
  if (due.length === 0) return;
  try {
    const longest = Math.max(1, Math.min(Math.floor(longestMs), LONGEST_STORED_MS));
    // Renamed with its text (see PLAIN in settle.ts).
    await db.query(ANNOUNCE_SQL, [[...due].sort(), now, ANNOUNCE_EVERY_MS, longest], 'outlive_announce_v3');
    if (mine) for (const n of due) mine.set(n, at);
  } catch (err) {
    // A database migrated before 0010 has no outlive.known_tasks.
    if ((err as { code?: string }).code === UNDEFINED_TABLE) {
      throw Object.assign(new Error(`${(err as Error).message}: the outlive schema is older than this code; run migrate() to bring it up to date`, { cause: err }), {
        code: UNDEFINED_TABLE,
      });
    }
    throw err;
  }
}

/** Postgres's error code for a table that does not exist. */
const UNDEFINED_TABLE = '42P01';

/** When passes last said they knew a name, and when any pass last said anything. */
export interface KnownTasks {
  /** Name -> the last time a pass given it ran (within {@link ANNOUNCE_EVERY_MS}). */
  seen: Map<string, Date>;
  /** Name -> the longest timeout a pass given it can claim, where a pass said. */
  longest: Map<string, number>;
  /** The latest `seen_at` of any name: roughly when a pass last ran. */
  lastPass: Date | null;
}

/** Reads the known task names. */
export async function readKnownTasks(db: Executor): Promise<KnownTasks> {
  const rows = await db.query<{ name: string; seen_at: Date; longest_ms: number | null }>(`SELECT name, seen_at, longest_ms FROM outlive.known_tasks`);
  const seen = new Map(rows.map((r) => [r.name, new Date(r.seen_at)]));
  const longest = new Map<string, number>();
  for (const r of rows) if (r.longest_ms !== null) longest.set(r.name, r.longest_ms);
  let lastPass: Date | null = null;
  for (const at of seen.values()) if (!lastPass || at > lastPass) lastPass = at;
  return { seen, longest, lastPass };
}

/**
 * Why a ready task may be waiting on no one, in words, or null when a pass
 * that knows its name, and can give it `timeoutMs`, ran lately. A name counts
 * as unknown when passes have run since it was last announced by more than
 * the throttle allows.
 */
export function nobodyRuns(name: string, known: KnownTasks, timeoutMs: number): string | null {
  if (!known.lastPass) return null;
  const seen = known.seen.get(name);
  if (seen && known.lastPass.getTime() - seen.getTime() <= 2 * ANNOUNCE_EVERY_MS) {
    const longest = known.longest.get(name);
    if (longest === undefined || timeoutMs <= longest) return null;
    return (
      `no pass that knows task "${name}" can claim it: its timeoutMs of ${timeoutMs} ms is longer than the ${longest} ms ` +
      'the longest of their budgets leaves (budgetMs less reserveMs): raise that budget, or enqueue it with a shorter timeoutMs'
    );
  }
  const since = seen ? seen.toISOString() : null;
  return since
    ? `no pass that ran since ${since} knows task "${name}" (the last pass ran at ${known.lastPass.toISOString()}): deploy its handler, or cancel it`
    : `no pass that ran knows task "${name}" (the last pass ran at ${known.lastPass.toISOString()}): deploy its handler, or cancel it`;
}
