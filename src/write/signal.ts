/**
 * Signals: what ends a step made by `waitFor`, written in the caller's
 * transaction like an enqueue, as one statement so it is atomic on a pool
 * and fits in a drizzle `db.batch`.
 */
import { toExecutor, toStatementSql, type StatementSql, type Transactional } from '../db/executor.js';
import { OutliveError } from '../model/errors.js';
import { MAX_OUTPUT_BYTES, storableJson } from '../model/json.js';
import { checkSignalKey, MAX_WAIT_MS } from '../model/wait.js';
import { isWhole } from '../model/checks.js';
import type { BatchingDatabase } from './batch.js';

/** A signal that cannot be sent as given. Nothing was written. */
export class InvalidSignalError extends OutliveError {}

/** Options of {@link signal}. */
export interface SignalOptions {
  /** Unique per key: the same id again (a redelivered webhook) changes nothing. Default: a random UUID. */
  id?: string;
  /** How long a signal no wait took is kept, and its id remembered. Default a day; at most 365 days. */
  keepMs?: number;
}

/** What a signal did. */
export interface SignalResult {
  /** Waits it ended now (0: kept for a wait to come, or a duplicate). */
  delivered: number;
  /** True when this key already had a signal of this id: nothing changed. */
  duplicate: boolean;
}

/** How long a signal is kept by default: a day. */
export const DEFAULT_SIGNAL_KEEP_MS = 86_400_000;

const SEND_SIGNAL_SQL = 'SELECT delivered, duplicate FROM outlive.send_signal($1, $2, $3::jsonb, $4)';

/** Checks a signal and makes the statement that sends it; throws before anything is sent. */
export function signalStatement(key: string, payload: unknown, options: SignalOptions = {}): { text: string; values: unknown[] } {
  checkSignalKey(key, InvalidSignalError, 'signal');
  if (!options || typeof options !== 'object') throw new InvalidSignalError('outlive: signal: options must be an object');
  const unknown = Object.keys(options).filter((k) => k !== 'id' && k !== 'keepMs');
  if (unknown.length) throw new InvalidSignalError(`outlive: signal: unknown option(s) ${unknown.join(', ')}: use id, keepMs`);
  const id = options.id ?? globalThis.crypto.randomUUID();
  if (typeof id !== 'string' || id.length === 0 || id.length > 500 || /[\u0000-\u001f]/.test(id)) {
    throw new InvalidSignalError(`outlive: signal "${key}": id must be a string of 1 to 500 printable characters, got ${JSON.stringify(id)}`);
  }
  const keepMs = options.keepMs ?? DEFAULT_SIGNAL_KEEP_MS;
  if (!isWhole(keepMs, { min: 1, max: MAX_WAIT_MS })) throw new InvalidSignalError(`outlive: signal "${key}": keepMs must be a whole number from 1 to ${MAX_WAIT_MS}`);
  const stored = storableJson(payload, MAX_OUTPUT_BYTES);
  if (stored.why !== undefined) throw new InvalidSignalError(`outlive: signal "${key}": payload ${stored.why}`);
  return { text: SEND_SIGNAL_SQL, values: [key, id, stored.json ?? 'null', keepMs] };
}

/**
 * Sends a signal in the caller's transaction (pg, drizzle, Neon): every
 * step waiting on `key` ends with `payload` as its output, and the passes
 * listening are woken; with none waiting, it is kept (`keepMs`) for the
 * first wait on the key to take when it begins.
 *
 * ```ts
 * await db.transaction(async (tx) => {
 *   await tx.update(domains).set({ verifiedAt }).where(eq(domains.name, domain));
 *   await signal(tx, `dns:${domain}`, { verifiedAt }, { id: checkId });
 * });
 * ```
 */
export async function signal(tx: Transactional, key: string, payload: unknown, options: SignalOptions = {}): Promise<SignalResult> {
  const { text, values } = signalStatement(key, payload, options);
  const [row] = await toExecutor(tx).query<{ delivered: number; duplicate: boolean }>(text, values);
  return { delivered: Number(row!.delivered), duplicate: row!.duplicate === true || (row!.duplicate as unknown) === 't' };
}

/** The statement of a signal as drizzle's `execute` takes it. */
export function signalSql(key: string, payload: unknown, options: SignalOptions = {}): StatementSql {
  const { text, values } = signalStatement(key, payload, options);
  return toStatementSql(text, values);
}

/**
 * The batch item that sends a signal in a drizzle `db.batch([...])` (neon-http), committing with the batch.
 *
 * ```ts
 * await db.batch([db.update(payments).set({ paid: true }).where(...), batchSignal(db, `payment:${id}`, { paid: true }, { id: eventId })]);
 * ```
 */
export function batchSignal<D extends BatchingDatabase>(db: D, key: string, payload: unknown, options: SignalOptions = {}): ReturnType<D['execute']> {
  return db.execute(signalSql(key, payload, options)) as ReturnType<D['execute']>;
}
