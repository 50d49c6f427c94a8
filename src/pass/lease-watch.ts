/**
 * The lease watch of one pass: keeps the pass's tasks alive while they run,
 * and tells a handler through its signal when its row stopped being the
 * pass's (a cancelled run, a lease that expired and was recovered).
 *
 * A claim gives each row a lease of its own (its timeout, at most `leaseMs`,
 * plus the grace). Past that, the pass holds its rows through one row of
 * `outlive.leases`, renewed every half lease while it runs tasks longer than
 * a check interval: keeping 1,000 slow tasks alive costs one row write every
 * 15 s, not 1,000 a second (docs/benchmarks.md, "Liveness"). Whether a row is
 * still the pass's is read, not written: a SELECT of the running rows by key
 * every check. Only tasks running longer than one check interval are looked
 * at, so a pass of short tasks sends none of this.
 */
import type { Executor } from '../db/executor.js';
import { AttemptAbort, HandBackError, type Heartbeat } from './execute.js';

/** The reason a handler's signal carries when its row is no longer its to settle. */
export class LeaseLostError extends Error {
  constructor(taskId: string) {
    super(`task ${taskId} was cancelled or its lease was lost; its result will not be recorded`);
    this.name = 'LeaseLostError';
  }
}

// The pass's lease: one row, written or extended (never shortened) to now +
// leaseMs + grace. Its owner is the key, so the update is HOT.
export const RENEW_LEASE_SQL = `
INSERT INTO outlive.leases AS l (owner, expires_at)
VALUES ($1, coalesce($2::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+) ($3 OPERATOR(pg_catalog.*) interval '1 millisecond'))
ON CONFLICT (owner) DO UPDATE SET expires_at = greatest(l.expires_at, excluded.expires_at)`;

// A pass that ends lets its lease go; what it still held (nothing, normally)
// falls back on the rows' own leases.
export const END_LEASE_SQL = `DELETE FROM outlive.leases WHERE owner OPERATOR(pg_catalog.=) $1`;

// Which of these rows the pass no longer holds: cancelled, or recovered (and
// perhaps claimed again) while its handler ran. Read only: the primary key
// finds each row.
export const LOST_SQL = `
SELECT x.id::text FROM pg_catalog.unnest($1::bigint[]) AS x(id)
WHERE NOT EXISTS (SELECT 1 FROM outlive.tasks t
                  WHERE t.id OPERATOR(pg_catalog.=) x.id AND t.state OPERATOR(pg_catalog.=) 'running' AND t.lease_owner OPERATOR(pg_catalog.=) $2)`;

/** The lease a pass holds its tasks under. */
export interface Lease {
  owner: string;
  /** The time the pass acts at; null for the database's clock. */
  now: Date | null;
  leaseMs: number;
  leaseGraceMs: number;
}

/** Watches the leases of the tasks one pass is running. */
export class LeaseWatch {
  private readonly active = new Map<string, { abort: AttemptAbort; since: number }>();
  private readonly timer: ReturnType<typeof setInterval>;
  // The check in flight, awaited by stop(): the caller may close the pool as
  // soon as the pass returns.
  private checking: Promise<void> | null = null;
  // When the pass's lease row was last written (performance.now()), or null
  // while it has none.
  private renewedAt: number | null = null;
  private renewing: Promise<void> | null = null;

  constructor(
    private readonly exec: Executor,
    private readonly lease: Lease,
    private readonly checkMs: number,
  ) {
    this.timer = setInterval(() => this.check(), checkMs);
  }

  /** Starts watching a task that starts running now; returns the abort its handler's signal follows. */
  track(id: string, abort = new AttemptAbort()): AttemptAbort {
    this.active.set(id, { abort, since: performance.now() });
    return abort;
  }

  /** Stops watching a task whose handler returned. */
  untrack(id: string): void {
    this.active.delete(id);
  }

  /** Aborts every running handler with a {@link HandBackError} (the pass is shutting down). */
  handBackAll(): void {
    for (const { abort } of this.active.values()) abort.abort(new HandBackError());
  }

  /**
   * Writes the pass's lease when it has none or half of it is spent (or,
   * with `soon`, when it was last written more than a check ago): the one
   * write that keeps every task of the pass alive.
   */
  private renew(soon = false): Promise<void> {
    const age = this.renewedAt === null ? Infinity : performance.now() - this.renewedAt;
    if (age < (soon ? this.checkMs : this.lease.leaseMs / 2)) return Promise.resolve();
    this.renewing ??= (async () => {
      const at = performance.now();
      try {
        const { owner, now, leaseMs, leaseGraceMs } = this.lease;
        await this.exec.query(RENEW_LEASE_SQL, [owner, now, leaseMs + leaseGraceMs]);
        this.renewedAt = at;
      } finally {
        this.renewing = null;
      }
    })();
    return this.renewing;
  }

  /** `ctx.heartbeat()` of any task of this pass: the pass's lease renewed if it is getting old, and whether the row is still the pass's. */
  readonly heartbeat: Heartbeat = async (row, abort) => {
    await this.renew(true);
    const lost = await this.exec.query<{ id: string }>(LOST_SQL, [[row.id], this.lease.owner]);
    if (lost.length > 0) abort.abort(new LeaseLostError(row.id));
    return lost.length === 0;
  };

  /** One check: renews the pass's lease when due, aborts the handlers of what it lost. */
  check(): Promise<void> {
    if (this.checking) return this.checking;
    const cutoff = performance.now() - this.checkMs;
    const ids = [...this.active].filter(([, a]) => a.since <= cutoff).map(([id]) => id);
    if (ids.length === 0) return Promise.resolve();
    this.checking = (async () => {
      try {
        await this.renew();
        const lost = await this.exec.query<{ id: string }>(LOST_SQL, [ids, this.lease.owner]);
        for (const { id } of lost) this.active.get(id)?.abort.abort(new LeaseLostError(id));
      } catch {
        // A failed check is retried at the next interval; settling is what guards correctness.
      } finally {
        this.checking = null;
      }
    })();
    return this.checking;
  }

  /** Stops checking, once the check in flight (if any) has ended, and lets the pass's lease go. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.checking;
    await this.renewing?.catch(() => undefined);
    if (this.renewedAt === null) return;
    this.renewedAt = null;
    // If this fails the lease just expires: an expired lease holds nothing, and recovery deletes it.
    await this.exec.query(END_LEASE_SQL, [this.lease.owner]).catch(() => undefined);
  }
}
