/**
 * The settler of one pass: batches outcomes into settles. An outcome waits
 * for the end of the event loop's turn it arrived in, so handlers that finish
 * together settle together; while one settle statement is in flight, the
 * outcomes of handlers that finish meanwhile wait, and go together in the
 * next. Under load that folds many settles into one round trip and one
 * commit (docs/benchmarks.md, "What moved it: settles batched by turn").
 */
import type { PoolLike } from '../db/executor.js';
import type { Redact } from '../model/redact.js';
import type { Outcome } from './execute.js';
import { settle, SettleIncompleteError, type SettledRow } from './settle.js';
import type { PassSpan } from '../model/telemetry.js';

/** What one settle of a batch did. */
export interface SettledBatch {
  /** The rows it changed. */
  rows: SettledRow[];
  /** How many outcomes it was given. */
  size: number;
  /** Outcomes not written (a lock meeting that never cleared): their rows keep their leases. */
  kept: number;
  /** Whether it gave back slots of limit keys, which may have made waiting tasks ready. */
  freedSlots: boolean;
}

/** Batches the outcomes of one pass into settles under its lease. */
export class Settler {
  private readonly queue: Outcome[] = [];
  private flushing: Promise<void> | null = null;
  private waiting = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;

  constructor(
    private readonly pool: PoolLike,
    private readonly owner: string,
    private readonly now: Date | null,
    /** Called after each batch, with what landed. */
    private readonly settled: (batch: SettledBatch) => void,
    /** Called with a database error; the batch's rows keep their leases for recovery. */
    private readonly failed: (err: unknown) => void,
    /** The pass's span, each settle a child of it; null when nothing is traced. */
    private readonly trace: PassSpan | null = null,
    /** Blanks the deployment's secrets out of the errors the rows keep. */
    private readonly redact?: Redact,
  ) {}

  /** Outcomes pushed and not yet through a settle. */
  get unsettled(): number {
    return this.waiting;
  }

  /**
   * Queues an outcome; it is settled with whatever else is queued at the end
   * of this turn, or when the settle in flight ends.
   */
  push(outcome: Outcome): void {
    this.queue.push(outcome);
    this.waiting++;
    if (!this.flushing && !this.timer) this.timer = setTimeout(() => void this.flush(), 0);
  }

  /** Settles everything queued now, without waiting for the turn to end; resolves when no settle is in flight. */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.flushing) return this.flushing;
    this.flushing = (async () => {
      while (this.queue.length > 0) {
        const batch = this.queue.splice(0, this.queue.length);
        const span = this.trace?.startSettle(batch.length);
        try {
          let rows: SettledRow[];
          let kept = 0;
          try {
            rows = await settle(this.pool, this.owner, batch, this.now, this.redact);
          } catch (err) {
            // What landed is counted; the rest keep their leases for recovery.
            if (!(err instanceof SettleIncompleteError)) throw err;
            this.failed(err.cause ?? err);
            rows = err.rows;
            kept = err.kept;
          }
          this.waiting -= batch.length;
          span?.end(rows.length);
          this.settled({ rows, size: batch.length, kept, freedSlots: rows.length > 0 && batch.some((o) => o.governed) });
        } catch (err) {
          span?.end(0, err);
          this.waiting -= batch.length;
          this.failed(err);
          this.settled({ rows: [], size: batch.length, kept: batch.length, freedSlots: false });
        }
      }
      this.flushing = null;
    })();
    return this.flushing;
  }
}
