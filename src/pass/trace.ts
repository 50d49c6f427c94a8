/**
 * What a traced pass reads about the tasks it claimed: the enqueue's trace
 * context to link each attempt to, its step, and how long it waited to
 * start. Read only when something records them (src/model/telemetry.ts),
 * one statement per claim, so the claim itself stays as it is.
 */
import type { Executor } from '../db/executor.js';
import type { AttemptDetail, AttemptOutcome, TelemetryError } from '../model/telemetry.js';
import type { Outcome } from './execute.js';
import type { ClaimedTask } from './claim.js';
import { WAIT_TASK } from '../model/wait.js';

/** One claimed task as its attempt's span needs it. A step's start latency is null: its due time is its release, not kept. */
export type TraceOf = AttemptDetail;

// By primary key, rows the claim just wrote; for a step on its first
// attempt, the end of a wait before it that a signal ended (its edges by
// primary key), as /metrics reads it (src/admin/metrics.ts). Renamed with
// its text (see PLAIN in settle.ts).
const TRACE_OF_SQL = `
SELECT t.id::text, t.trace_context, t.step,
       CASE WHEN t.run_id IS NULL THEN (extract(epoch FROM t.started_at OPERATOR(pg_catalog.-) t.run_at) OPERATOR(pg_catalog.*) 1000)::float8 END AS latency_ms,
       CASE WHEN t.run_id IS NOT NULL AND t.attempts OPERATOR(pg_catalog.=) 1 THEN (
         SELECT (extract(epoch FROM t.started_at OPERATOR(pg_catalog.-) pg_catalog.max(w.finished_at)) OPERATOR(pg_catalog.*) 1000)::float8
         FROM outlive.task_deps d JOIN outlive.tasks w ON w.id OPERATOR(pg_catalog.=) d.depends_on
         WHERE d.task_id OPERATOR(pg_catalog.=) t.id AND w.name OPERATOR(pg_catalog.=) $2 AND w.state OPERATOR(pg_catalog.=) 'succeeded' AND w.signal IS NOT NULL) END AS resume_ms
FROM outlive.tasks t WHERE t.id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`;

async function readTraces(db: Executor, ids: readonly string[]): Promise<Map<string, TraceOf>> {
  const into = new Map<string, TraceOf>();
  try {
    const rows = await db.query<{ id: string; trace_context: string | null; step: string | null; latency_ms: number | null; resume_ms: number | null }>(
      TRACE_OF_SQL,
      [ids, WAIT_TASK],
      'outlive_trace_of_v2',
    );
    const ms = (v: number | null) => (v === null ? null : Math.max(0, v));
    for (const r of rows) into.set(r.id, { link: r.trace_context, step: r.step, startLatencyMs: ms(r.latency_ms), resumeLatencyMs: ms(r.resume_ms) });
  } catch {
    // Telemetry never fails a pass: an attempt whose row was not read is traced without its link.
  }
  return into;
}

/**
 * The reads of one pass's claimed rows, in the background: an attempt
 * starts as soon as it is claimed, and its span is ended once its row's
 * read is in: awaiting it would put a round trip between every claim and
 * its starts (docs/benchmarks.md, "Tracing: what outlive/otel costs a drain").
 */
export class TraceReads {
  private readonly byRow = new Map<string, ReadBatch>();
  private readonly reading = new Set<Promise<void>>();

  constructor(private readonly db: Executor) {}

  /** Starts reading the rows of `ids`. */
  read(ids: readonly string[]): void {
    const batch: ReadBatch = { rows: null, waiting: [] };
    for (const id of ids) this.byRow.set(id, batch);
    const done = readTraces(this.db, ids).then((rows) => {
      batch.rows = rows;
      for (const [id, fn] of batch.waiting) call(fn, rows.get(id));
      batch.waiting = [];
      this.reading.delete(done);
    });
    this.reading.add(done);
  }

  /** Calls `fn` with the row's read (undefined if it was not read) once it is in, and forgets the row. */
  after(id: string, fn: (trace: TraceOf | undefined) => void): void {
    const batch = this.byRow.get(id);
    this.byRow.delete(id);
    if (!batch) call(fn, undefined);
    else if (batch.rows) call(fn, batch.rows.get(id));
    else batch.waiting.push([id, fn]);
  }

  /** Forgets a row handed back unstarted. */
  forget(id: string): void {
    this.byRow.delete(id);
  }

  /** Resolves when every read is in and every `after` has run. */
  async settled(): Promise<void> {
    while (this.reading.size > 0) await Promise.all(this.reading);
  }
}

/** Calls an observer's callback: what it throws is its own, never the pass's. */
function call(fn: (trace: TraceOf | undefined) => void, trace: TraceOf | undefined): void {
  try {
    fn(trace);
  } catch {
    // Telemetry never fails a pass.
  }
}

/** One claim's read: the rows once in, and who waits for them until then. */
interface ReadBatch {
  rows: Map<string, TraceOf> | null;
  waiting: [string, (trace: TraceOf | undefined) => void][];
}

/** The signal keys of claimed waits (a sleep has none; a row whose input is not a wait's is left to beginWaits to fail). */
export function waitKeys(rows: readonly ClaimedTask[]): string[] {
  const keys: string[] = [];
  for (const r of rows) {
    const key = (r.input as { key?: unknown } | null)?.key;
    if (typeof key === 'string') keys.push(key);
  }
  return keys;
}

/** An outcome as telemetry names it. */
export function outcomeOf(outcome: Outcome): AttemptOutcome {
  switch (outcome.state) {
    case 'pending':
      return 'retried';
    default:
      return outcome.state;
  }
}

/** The error an outcome carries, as a span records it. */
export function errorOf(outcome: Outcome): TelemetryError | undefined {
  if (outcome.state !== 'pending' && outcome.state !== 'failed') return undefined;
  const { name, message, stack } = outcome.error;
  return stack === undefined ? { name, message } : { name, message, stack };
}
