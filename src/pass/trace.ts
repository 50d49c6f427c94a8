/**
 * What a traced pass reads about the tasks it claimed: the enqueue's trace
 * context to link each attempt to, its step, and how long it waited to
 * start. Read only when telemetry is registered (src/model/telemetry.ts),
 * one statement per claim, so the claim itself stays as it is.
 */
import type { Executor } from '../db/executor.js';
import type { AttemptOutcome, TelemetryError } from '../model/telemetry.js';
import type { Outcome } from './execute.js';

/** One claimed task as its attempt's span needs it. */
export interface TraceOf {
  traceContext: string | null;
  step: string | null;
  /** From when it was due to its claim; null for a step of a run, whose due time is its release, not kept. */
  startLatencyMs: number | null;
}

// By primary key, rows the claim just wrote. Renamed with its text (see PLAIN in settle.ts).
const TRACE_OF_SQL = `
SELECT id::text, trace_context, step,
       CASE WHEN run_id IS NULL THEN (extract(epoch FROM started_at OPERATOR(pg_catalog.-) run_at) OPERATOR(pg_catalog.*) 1000)::float8 END AS latency_ms
FROM outlive.tasks WHERE id OPERATOR(pg_catalog.=) ANY ($1::bigint[])`;

/** Reads the trace of each claimed task by id. Never rejects: an attempt with no trace read is traced without its link. */
export async function readTraces(db: Executor, ids: readonly string[], into: Map<string, TraceOf>): Promise<void> {
  try {
    const rows = await db.query<{ id: string; trace_context: string | null; step: string | null; latency_ms: number | null }>(TRACE_OF_SQL, [ids], 'outlive_trace_of_v1');
    for (const r of rows) into.set(r.id, { traceContext: r.trace_context, step: r.step, startLatencyMs: r.latency_ms === null ? null : Math.max(0, r.latency_ms) });
  } catch {
    // Telemetry never fails a pass.
  }
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
