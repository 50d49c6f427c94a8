/**
 * The nudge: a signed request to a drain endpoint, sent by the app after the
 * transaction that enqueued a task has committed, so a pass starts at once
 * instead of at the next cron tick.
 *
 * A nudge carries no work and no authority over rows. Losing one is harmless
 * (the row is the truth; the next cron tick claims the task), and so is a
 * duplicate (passes claim disjoint tasks). What the signature protects is the
 * endpoint: without the shared secret nobody can make it run passes.
 *
 * The signature is HMAC-SHA256 over `<timestamp>.<nonce>.<body>` with the
 * shared secret, sent as
 * `Outlive-Signature: t=<unix ms>,n=<nonce>,v1=<base64url mac>`. The verifier
 * rejects a missing, malformed or wrong signature; a timestamp further than
 * the tolerance from its clock (stale, or from the future); and a nonce it has
 * seen before (replayed). Seen nonces are kept in `outlive.used_nonces` for
 * twice the tolerance after their timestamp, then pruned: by then the
 * timestamp alone rejects them, so the table stays small and the check stays
 * sound. (A timestamp window alone would let a captured request be replayed
 * for the whole window; a nonce alone would need to be remembered forever.)
 *
 * Only WebCrypto (`crypto.subtle`) is used, so this runs on Workers, Vercel,
 * Deno, Bun and Node alike.
 */
import { MIN_SECRET_LENGTHS } from '../model/checks.js';
import { ConfigError, toError } from '../model/errors.js';
import type { Executor } from '../db/executor.js';

/** The header that carries a nudge's signature. */
export const SIGNATURE_HEADER = 'Outlive-Signature';

/** How far a signed timestamp may be from the verifier's clock, by default: 2 minutes. */
export const DEFAULT_TOLERANCE_MS = 120_000;

/** Shortest secret accepted: 32 characters (`openssl rand -hex 32` gives 64). */
export const MIN_SECRET_LENGTH = MIN_SECRET_LENGTHS.drain;

const NONCE_PATTERN = /^[A-Za-z0-9_-]{16,128}$/;
const encoder = new TextEncoder();

/** Checks a shared secret eagerly, with a message that names the fix. */
export function checkSecret(secret: unknown, name = 'OUTLIVE_DRAIN_SECRET'): string {
  if (typeof secret !== 'string' || secret.length < MIN_SECRET_LENGTH) {
    throw new ConfigError(
      `outlive: ${name} must be a secret of at least ${MIN_SECRET_LENGTH} characters ` +
        `(generate one with \`openssl rand -hex 32\` and set it on both the app and the drain endpoint)`,
    );
  }
  return secret;
}

function hmacKey(secret: string): Promise<CryptoKey> {
  return globalThis.crypto.subtle.importKey('raw', encoder.encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, [
    'sign',
    'verify',
  ]);
}

function base64url(bytes: ArrayBuffer): string {
  let binary = '';
  for (const b of new Uint8Array(bytes)) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function fromBase64url(text: string): Uint8Array<ArrayBuffer> | null {
  if (!/^[A-Za-z0-9_-]+$/.test(text)) return null;
  try {
    const binary = atob(text.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - (text.length % 4)) % 4));
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  } catch {
    return null;
  }
}

function newNonce(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return base64url(bytes.buffer);
}

/** Options of {@link signNudge}. */
export interface SignOptions {
  /** The signing time; default now. */
  now?: Date;
  /** The nonce; default 16 random bytes. Tests pass one to replay it. */
  nonce?: string;
}

/**
 * Signs a drain request's body with the shared secret and returns the value
 * of the {@link SIGNATURE_HEADER} header to send with it.
 */
export async function signNudge(secret: string, body: string, options: SignOptions = {}): Promise<string> {
  checkSecret(secret);
  const t = (options.now ?? new Date()).getTime();
  const n = options.nonce ?? newNonce();
  if (!NONCE_PATTERN.test(n)) throw new ConfigError('outlive: a nudge nonce must be 16-128 characters of A-Z a-z 0-9 _ -');
  const mac = await globalThis.crypto.subtle.sign('HMAC', await hmacKey(secret), encoder.encode(`${t}.${n}.${body}`));
  return `t=${t},n=${n},v1=${base64url(mac)}`;
}

/** Why a drain request was refused. */
export type RejectReason = 'missing' | 'malformed' | 'wrong' | 'stale' | 'replayed';

/** The outcome of checking a signature. */
export type Verification =
  | { ok: true; timestamp: Date; nonce: string }
  | { ok: false; reason: RejectReason };

/** Options of {@link verifySignature} and {@link verifyNudge}. */
export interface VerifyOptions {
  /** The verifier's clock; default now. */
  now?: Date;
  /** How far the signed timestamp may be from `now`. Default {@link DEFAULT_TOLERANCE_MS}. */
  toleranceMs?: number;
}

function parseHeader(header: string): { t: number; n: string; mac: Uint8Array<ArrayBuffer> } | null {
  const fields = new Map<string, string>();
  for (const part of header.split(',')) {
    const eq = part.indexOf('=');
    if (eq <= 0) return null;
    const key = part.slice(0, eq).trim();
    if (fields.has(key)) return null;
    fields.set(key, part.slice(eq + 1).trim());
  }
  const t = fields.get('t');
  const n = fields.get('n');
  const v1 = fields.get('v1');
  if (!t || !/^\d{1,16}$/.test(t) || !n || !NONCE_PATTERN.test(n) || !v1) return null;
  const mac = fromBase64url(v1);
  if (!mac || mac.length !== 32) return null;
  return { t: Number(t), n, mac };
}

/**
 * Checks a signature header against the body and the shared secret, without
 * the replay check (which needs the database; see {@link verifyNudge}). The
 * MAC is compared by `crypto.subtle.verify`, in constant time.
 */
export async function verifySignature(
  secret: string,
  header: string | null | undefined,
  body: string,
  options: VerifyOptions = {},
): Promise<Verification> {
  checkSecret(secret);
  if (!header) return { ok: false, reason: 'missing' };
  const parsed = parseHeader(header);
  if (!parsed) return { ok: false, reason: 'malformed' };
  const valid = await globalThis.crypto.subtle.verify(
    'HMAC',
    await hmacKey(secret),
    parsed.mac,
    encoder.encode(`${parsed.t}.${parsed.n}.${body}`),
  );
  if (!valid) return { ok: false, reason: 'wrong' };
  // Checked after the MAC, so only the holder of the secret learns about clocks.
  const now = (options.now ?? new Date()).getTime();
  if (Math.abs(now - parsed.t) > (options.toleranceMs ?? DEFAULT_TOLERANCE_MS)) return { ok: false, reason: 'stale' };
  return { ok: true, timestamp: new Date(parsed.t), nonce: parsed.n };
}

// Records a nonce as used; zero rows back means it was used before. The same
// statement prunes nonces whose timestamps any verifier now rejects as stale
// (they expire at timestamp + 2 x tolerance, so verifiers whose clocks differ
// by less than the tolerance agree). Both times come from the verifier's
// clock, the one the staleness check used, never mixed with the database's.
export const USE_NONCE_SQL = `
WITH pruned AS (
  DELETE FROM outlive.used_nonces WHERE expires_at < $3::timestamptz
)
INSERT INTO outlive.used_nonces (nonce, expires_at)
VALUES ($1, $2::timestamptz)
ON CONFLICT (nonce) DO NOTHING
RETURNING nonce`;

/**
 * Records a nonce as used, once: true the first time, false on every later
 * call while it is remembered. Commits on its own (the executor is a pool or
 * an autocommit client), so two verifiers racing on one nonce see one winner.
 */
export async function useNonce(db: Executor, nonce: string, timestamp: Date, options: VerifyOptions = {}): Promise<boolean> {
  const tolerance = options.toleranceMs ?? DEFAULT_TOLERANCE_MS;
  const expires = new Date(timestamp.getTime() + 2 * tolerance);
  const rows = await db.query(USE_NONCE_SQL, [nonce, expires, options.now ?? new Date()]);
  return rows.length === 1;
}

/**
 * Verifies a drain request: its signature (the {@link SIGNATURE_HEADER}
 * header's value) over the body, its freshness, and that its nonce has not
 * been used. The nonce is spent only when the signature is valid and fresh,
 * so forged or stale requests cannot fill the table.
 *
 * Status to answer with when it fails: 401 for `missing`, `malformed`,
 * `wrong` and `stale`; 403 for `replayed` (well signed, but spent).
 */
export async function verifyNudge(
  db: Executor,
  secret: string,
  signature: string | null | undefined,
  body: string,
  options: VerifyOptions = {},
): Promise<Verification> {
  const verification = await verifySignature(secret, signature, body, options);
  if (!verification.ok) return verification;
  const fresh = await useNonce(db, verification.nonce, verification.timestamp, options);
  return fresh ? verification : { ok: false, reason: 'replayed' };
}

/** The HTTP status for a refused drain request. */
export function rejectStatus(reason: RejectReason): 401 | 403 {
  return reason === 'replayed' ? 403 : 401;
}

/** Options of {@link nudge}. */
export interface NudgeOptions {
  /** Give up after this long. Default 5 s: a nudge is a hint, never worth waiting for. */
  timeoutMs?: number;
  /**
   * Ask the endpoint to answer at once and run the pass in the background
   * (`Prefer: respond-async`), where it can (Workers). Default true.
   */
  respondAsync?: boolean;
  /** The fetch to use; default the global one. */
  fetch?: typeof fetch;
}

/** What became of a nudge. A lost nudge is harmless, so losing one is a result, not an error. */
export interface NudgeResult {
  /** True when the endpoint accepted it (2xx). */
  delivered: boolean;
  /** The endpoint's status, or null when no answer came. */
  status: number | null;
  /** Why it was not delivered, when it was not. */
  error?: Error;
}

/**
 * Signs and sends a nudge to a drain endpoint. Call it after the enqueuing
 * transaction has committed (a nudge before commit may find nothing to
 * claim); on Workers, inside `ctx.waitUntil(...)` so the response is not held.
 *
 * ```ts
 * await db.transaction(async (tx) => {
 *   await tx.insert(orders).values(order);
 *   await enqueue(tx, chargeCard, { orderId: order.id });
 * });
 * ctx.waitUntil(nudge(env.DRAIN_URL, env.OUTLIVE_DRAIN_SECRET));
 * ```
 *
 * It resolves with what happened and does not reject when the nudge is lost
 * (refused, timed out, unreachable): the next cron tick picks the task up.
 * It throws {@link ConfigError} only for a secret that is too short or a URL
 * that is not absolute.
 */
export async function nudge(url: string, secret: string, body: string | object = '', options: NudgeOptions = {}): Promise<NudgeResult> {
  // Configuration mistakes throw: a nudge that can never be delivered is a bug, not a lost message.
  checkSecret(secret);
  try {
    new URL(url);
  } catch {
    throw new ConfigError('outlive: nudge needs the absolute URL of the drain endpoint, such as https://jobs.example.com/drain');
  }
  try {
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    const headers: Record<string, string> = {
      'content-type': typeof body === 'string' ? 'text/plain;charset=UTF-8' : 'application/json',
      [SIGNATURE_HEADER]: await signNudge(secret, text),
    };
    if (options.respondAsync !== false) headers['prefer'] = 'respond-async';
    const response = await (options.fetch ?? globalThis.fetch)(url, {
      method: 'POST',
      headers,
      body: text,
      signal: AbortSignal.timeout(options.timeoutMs ?? 5_000),
    });
    // Drain the body so the connection is released.
    await response.arrayBuffer().catch(() => undefined);
    if (response.ok) return { delivered: true, status: response.status };
    return { delivered: false, status: response.status, error: new Error(`drain endpoint answered ${response.status}`) };
  } catch (err) {
    return { delivered: false, status: null, error: toError(err) };
  }
}

/**
 * Compares a presented secret (such as a `Bearer` token) with the expected
 * one in time that does not depend on where they differ.
 */
export function secretsEqual(presented: string, expected: string): boolean {
  const a = encoder.encode(presented);
  const b = encoder.encode(expected);
  let diff = a.length ^ b.length;
  for (let i = 0; i < b.length; i++) diff |= (a[i % (a.length || 1)] ?? 0) ^ b[i]!;
  return diff === 0;
}
