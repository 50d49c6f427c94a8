/**
 * What a traced pass knows of the tasks it claimed, for each attempt's span
 * and metrics: the enqueue's trace context, the step and how long the task
 * waited to start come with the claim (migration 0021); the time from a
 * signal to the step after its wait is read beside the claim, for a step on
 * its first attempt only.
 */
import type { Executor } from '../db/executor.js';
import type { AttemptDetail, AttemptOutcome, TelemetryError } from '../model/telemetry.js';
import type { Outcome } from './execute.js';
import type { ClaimedTask } from './claim.js';
import { WAIT_TASK } from '../model/wait.js';

// For each step, the end of a wait before it that a signal ended (its edges
// by primary key), as /metrics reads it (src/admin/metrics.ts). Renamed with
// its text (see PLAIN in settle.ts).
const RESUME_OF_SQL = `
SELECT t.id::text,
       (SELECT (extract(epoch FROM t.started_at OPERATOR(pg_catalog.-) pg_catalog.max(w.finished_at)) OPERATOR(pg_catalog.*) 1000)::float8
        FROM outlive.task_deps d JOIN outlive.tasks w ON w.id OPERATOR(pg_catalog.=) d.depends_on
        WHERE d.task_id OPERATOR(pg_catalog.=) t.id AND w.name OPERATOR(pg_catalog.=) $2 AND w.state OPERATOR(pg_catalog.=) 'succeeded' AND w.signal IS NOT NULL) AS resume_ms
FROM outlive.tasks t WHERE t.id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`;

/** Milliseconds from Postgres, never below 0 (clocks of a pass and the database differ). */
const ms = (v: number | null | undefined) => (v == null ? null : Math.max(0, v));

async function readResumes(db: Executor, ids: readonly string[]): Promise<Map<string, number>> {
  const into = new Map<string, number>();
  try {
    const rows = await db.query<{ id: string; resume_ms: number | null }>(RESUME_OF_SQL, [ids, WAIT_TASK], 'outlive_resume_of_v1');
    for (const r of rows) if (r.resume_ms !== null) into.set(r.id, ms(r.resume_ms)!);
  } catch {
    // Telemetry never fails a pass: a step whose row was not read goes without its resume latency.
  }
  return into;
}

/**
 * The details of one pass's claimed rows. Most are known at the claim; the
 * steps' resume latencies are read in the background: an attempt starts as
 * soon as it is claimed, and its span is ended once its row's read is in:
 * awaiting it would put a round trip between every claim and its starts
 * (docs/benchmarks.md, "Tracing: what outlive/otel costs a drain").
 */
export class TraceReads {
  private readonly byRow = new Map<string, ReadBatch>();
  private readonly reading = new Set<Promise<void>>();

  constructor(private readonly db: Executor) {}

  /** Starts reading what the claim did not return, for the rows that need it. */
  read(rows: readonly ClaimedTask[]): void {
    let ids: string[] | null = null;
    for (const r of rows) if (r.run_id !== null && r.attempts === 1 && r.name !== WAIT_TASK) (ids ??= []).push(r.id);
    if (!ids) return;
    const batch: ReadBatch = { resumes: null, waiting: [] };
    for (const id of ids) this.byRow.set(id, batch);
    const done = readResumes(this.db, ids).then((resumes) => {
      batch.resumes = resumes;
      for (const [id, detail, fn] of batch.waiting) call(fn, withResume(id, detail, resumes));
      batch.waiting = [];
      this.reading.delete(done);
    });
    this.reading.add(done);
  }

  /** Calls `fn` with the row's detail once all of it is known, and forgets the row. */
  after(row: ClaimedTask, fn: (detail: AttemptDetail) => void): void {
    const detail: AttemptDetail = { startLatencyMs: ms(row.start_latency_ms) };
    const batch = this.byRow.get(row.id);
    if (!batch) return call(fn, detail);
    this.byRow.delete(row.id);
    if (batch.resumes) call(fn, withResume(row.id, detail, batch.resumes));
    else batch.waiting.push([row.id, detail, fn]);
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

function withResume(id: string, detail: AttemptDetail, resumes: Map<string, number>): AttemptDetail {
  const resume = resumes.get(id);
  return resume === undefined ? detail : { ...detail, resumeLatencyMs: resume };
}

/** Calls an observer's callback: what it throws is its own, never the pass's. */
function call(fn: (detail: AttemptDetail) => void, detail: AttemptDetail): void {
  try {
    fn(detail);
  } catch {
    // Telemetry never fails a pass.
  }
}

/** One claim's read: the resumes once in, and who waits for them until then. */
interface ReadBatch {
  resumes: Map<string, number> | null;
  waiting: [string, AttemptDetail, (detail: AttemptDetail) => void][];
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
