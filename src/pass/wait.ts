/**
 * Beginning waits: the rows of the built-in task `$wait` a pass claimed, in
 * one call of `outlive.begin_waits` (migration 0017) per claim. Each ends
 * with its signal, ends at its deadline, or parks until one comes; the ended
 * ones become outcomes the settler writes like any task's, so their runs
 * move on through the same statements.
 */
import type { Executor } from '../db/executor.js';
import { waitTask, WaitTimeoutError, type WaitInput } from '../model/wait.js';
import type { ClaimedTask } from './claim.js';
import { entry, failure, type Outcome } from './execute.js';

// Renamed with its text (see PLAIN in settle.ts).
const BEGIN_WAITS_SQL = 'SELECT id, outcome, payload, deadline FROM outlive.begin_waits($1::bigint[], $2::int[], $3, $4)';

/** What beginning a claim's waits came to. */
export interface BegunWaits {
  /** Waits ended (by a signal or a deadline) or failed, to settle. */
  outcomes: Outcome[];
  /** Waits parked until their signal or deadline. */
  parked: number;
}

/** Begins the claimed waits `rows` of the pass `owner`. Never rejects: a database error retries them as a failed attempt would. */
export async function beginWaits(db: Executor, rows: readonly ClaimedTask[], owner: string, now: Date | null): Promise<BegunWaits> {
  const byId = new Map(rows.map((r) => [r.id, r]));
  let result: { id: string; outcome: 'signal' | 'timeout' | 'park'; payload: unknown }[];
  try {
    result = await db.query(BEGIN_WAITS_SQL, [rows.map((r) => r.id), rows.map((r) => r.attempts), owner, now], 'outlive_begin_waits_v1');
  } catch (err) {
    return { outcomes: rows.map((r) => failure(waitTask, r, err)), parked: 0 };
  }
  const outcomes: Outcome[] = [];
  let parked = 0;
  for (const r of result) {
    const claimed = byId.get(r.id)!;
    if (r.outcome === 'park') parked++;
    else outcomes.push(ended(claimed, r.outcome, r.payload));
  }
  // Rows the call left out are no longer this pass's (cancelled, recovered): nothing to settle.
  return { outcomes, parked };
}

function ended(claimed: ClaimedTask, how: 'signal' | 'timeout', payload: unknown): Outcome {
  const base = { id: claimed.id, runId: claimed.run_id, attempt: claimed.attempts };
  const input = claimed.input as WaitInput;
  if (how === 'signal') return { ...base, state: 'succeeded', output: payload == null ? null : JSON.stringify(payload) };
  if (!('key' in input)) return { ...base, state: 'succeeded', output: null };
  if (input.onTimeout) return { ...base, state: 'succeeded', output: input.onTimeout.value === undefined ? null : JSON.stringify(input.onTimeout.value) };
  return { ...base, state: 'failed', error: entry(new WaitTimeoutError(input.key, input.timeoutMs), claimed.attempts) };
}
