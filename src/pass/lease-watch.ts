/**
 * The lease watch of one pass: extends the leases of the tasks it has been
 * running for a while, and tells a handler through its signal when its row
 * stopped being the pass's (a cancelled run, a lease that expired and was
 * recovered). Only tasks running longer than one check interval are looked
 * at, so a pass of short tasks never sends its statement.
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

// The heartbeat: extends the leases this pass still holds (a compare-and-set
// on state and owner) and returns the ids it no longer holds.
export const HEARTBEAT_SQL = `
WITH held AS (
  UPDATE outlive.tasks
  SET lease_expires_at = greatest(lease_expires_at, coalesce($3::timestamptz, now()) + (least(timeout_ms, $4) + $5) * interval '1 millisecond')
  WHERE id = ANY($1::bigint[]) AND state = 'running' AND lease_owner = $2
  RETURNING id
)
SELECT x.id::text FROM unnest($1::bigint[]) AS x(id) WHERE x.id NOT IN (SELECT id FROM held)`;

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

  /** `ctx.heartbeat()` of any task of this pass. */
  readonly heartbeat: Heartbeat = async (row, abort) => {
    const lost = await this.exec.query<{ id: string }>(HEARTBEAT_SQL, [[row.id], this.lease.owner, this.lease.now, this.lease.leaseMs, this.lease.leaseGraceMs]);
    if (lost.length > 0) abort.abort(new LeaseLostError(row.id));
    return lost.length === 0;
  };

  /** One check: extends what the pass still holds, aborts the handlers of what it lost. */
  check(): Promise<void> {
    if (this.checking) return this.checking;
    const cutoff = performance.now() - this.checkMs;
    const ids = [...this.active].filter(([, a]) => a.since <= cutoff).map(([id]) => id);
    if (ids.length === 0) return Promise.resolve();
    const { owner, now, leaseMs, leaseGraceMs } = this.lease;
    this.checking = (async () => {
      try {
        const lost = await this.exec.query<{ id: string }>(HEARTBEAT_SQL, [ids, owner, now, leaseMs, leaseGraceMs]);
        for (const { id } of lost) this.active.get(id)?.abort.abort(new LeaseLostError(id));
      } catch {
        // A failed check is retried at the next interval; settling is what guards correctness.
      } finally {
        this.checking = null;
      }
    })();
    return this.checking;
  }

  /** Stops checking, once the check in flight (if any) has ended. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.checking;
  }
}
