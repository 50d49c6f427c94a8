/**
 * The nudge: a signed request to a drain endpoint, sent by the app after the
 * transaction that enqueued a task has committed, so a pass starts at once
 * instead of at the next cron tick.
 *
 * A nudge carries no work and no authority over rows (the signal route's
 * calls, signed alike, do). Losing one is harmless
 * (the row is the truth; the next cron tick claims the task), and so is a
 * duplicate (passes claim disjoint tasks). What the signature protects is the
 * endpoint: without the shared secret nobody can make it run passes.
 *
 * The signature (format v2) is HMAC-SHA256, keyed with the shared secret,
 * over the bytes of
 *
 * ```
 * outlive-nudge-v2\n<METHOD>\n<endpoint>\n<timestamp>\n<nonce>\n<body bytes>
 * ```
 *
 * sent as
 * `Outlive-Signature: t=<unix ms>,n=<nonce>,e=<endpoint, percent-encoded>,v2=<base64url mac>`.
 * The endpoint is the drain the nudger meant (see {@link canonicalEndpoint}),
 * so a nudge captured on its way to one deployment cannot be replayed on
 * another that shares the secret but keeps its nonces in another database.
 * The body is signed as the exact bytes sent, never as a decoded string: two
 * byte strings that decode alike (a BOM, an invalid byte read as U+FFFD) are
 * two different bodies. The verifier rejects a missing, malformed or wrong
 * signature; a v1 signature (outdated); one for an endpoint it does not answer
 * as (misdirected); a timestamp further than the tolerance from its clock
 * (stale, or from the future); and a nonce it has seen before (replayed).
 *
 * Seen nonces are kept in `outlive.used_nonces` for twice the tolerance after
 * their timestamp, then pruned: by then the timestamp alone rejects them, so
 * the table stays small and the check stays sound. (A timestamp window alone
 * would let a captured request be replayed for the whole window; a nonce
 * alone would need to be remembered forever.) Nonces are spent per database,
 * which is why the endpoint must be signed: deployments sharing a secret do
 * not share their spent nonces.
 *
 * Only WebCrypto (`crypto.subtle`) is used, so this runs on Workers, Vercel,
 * Deno, Bun and Node alike.
 */
import { MIN_SECRET_LENGTHS } from '../model/checks.js';
import { ConfigError, toError } from '../model/errors.js';
import { toExecutor, type Transactional } from '../db/executor.js';

/** The header that carries a nudge's signature. */
export const SIGNATURE_HEADER = 'Outlive-Signature';

/** How far a signed timestamp may be from the verifier's clock, by default: 2 minutes. */
export const DEFAULT_TOLERANCE_MS = 120_000;

/** Shortest secret accepted: 32 characters (`openssl rand -hex 32` gives 64). */
export const MIN_SECRET_LENGTH = MIN_SECRET_LENGTHS.drain;

/** The version of the signature format `signNudge` writes and the verifier accepts. */
export const SIGNATURE_VERSION = 'v2';

/** The setting that names the endpoints a drain answers as (see {@link parseEndpoints}). */
export const DRAIN_URL_SETTING = 'OUTLIVE_DRAIN_URL';

const NONCE_PATTERN = /^[A-Za-z0-9_-]{16,128}$/;
// Endpoint ids have no dot, so a URL written without its scheme is refused rather than taken for an id.
const ENDPOINT_ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;
// Canonical endpoints are printable ASCII (URLs are serialised punycoded and percent-encoded), so a
// newline can never move a field boundary of the signed string.
const SIGNED_ENDPOINT_PATTERN = /^[\x21-\x7e]{1,2048}$/;
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

/** Decodes standard base64 (padding optional), or null for anything else. */
export function fromBase64(text: string): Uint8Array<ArrayBuffer> | null {
  const bare = text.replace(/=+$/, '');
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text) || bare.length % 4 === 1) return null;
  try {
    const binary = atob(bare + '='.repeat((4 - (bare.length % 4)) % 4));
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  } catch {
    return null;
  }
}

function fromBase64url(text: string): Uint8Array<ArrayBuffer> | null {
  return /^[A-Za-z0-9_-]+$/.test(text) ? fromBase64(text.replace(/-/g, '+').replace(/_/g, '/')) : null;
}

function newNonce(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return base64url(bytes.buffer);
}

/**
 * The canonical form of a drain endpoint, the one the signature covers: an
 * absolute `http(s)` URL reduced to `<scheme>://<host>[:<port>]<path>`, or an
 * endpoint id (1 to 128 of `A-Z a-z 0-9 _ -`) kept as it is.
 *
 * The URL parser lowercases the scheme and the host, drops the scheme's
 * default port and resolves `.` and `..`; on top of that, trailing slashes
 * are dropped (`/drain/` is the drain of `/drain`: platforms redirect and
 * rewrite between the two), and so are the query, the fragment and any
 * credentials. The query is left out because the drain never reads it and
 * proxies and rewrites add to it freely; what tells deployments apart is
 * their scheme, host, port and path. Throws {@link ConfigError} for anything
 * else.
 */
export function canonicalEndpoint(endpoint: string, name = 'the drain endpoint'): string {
  const text = endpoint.trim();
  if (ENDPOINT_ID_PATTERN.test(text)) return text;
  let url: URL | null = null;
  try {
    url = new URL(text);
  } catch {
    // Neither an id nor a URL: refused below.
  }
  if (!url || (url.protocol !== 'https:' && url.protocol !== 'http:')) {
    throw new ConfigError(
      `outlive: ${name} must be an absolute http(s) URL, such as https://jobs.example.com/drain, ` +
        `or an endpoint id of letters, digits, _ and -`,
    );
  }
  const path = url.pathname.replace(/\/+$/, '') || '/';
  return `${url.protocol}//${url.host}${path}`;
}

/**
 * Reads a comma-separated list of endpoints (URLs or ids), such as the
 * drain's {@link DRAIN_URL_SETTING}, into their canonical forms. Throws
 * {@link ConfigError} naming the setting (never its value) when an entry is
 * neither a URL nor an id, or when the list is empty.
 */
export function parseEndpoints(list: string, name: string = DRAIN_URL_SETTING): string[] {
  const entries = list.split(',').map((e) => e.trim()).filter((e) => e !== '');
  if (entries.length === 0) throw new ConfigError(`outlive: ${name} must list at least one URL or endpoint id; unset it to answer as the request's own URL`);
  return entries.map((e) => canonicalEndpoint(e, `each entry of ${name}`));
}

/** Options of {@link signNudge}. */
export interface SignOptions {
  /** The signing time; default now. */
  now?: Date;
  /** The nonce; default 16 random bytes. Tests pass one to replay it. */
  nonce?: string;
  /** The request's method; default `POST`, the only one the drain serves. */
  method?: string;
}

// The bytes the MAC covers. The body goes last, as bytes, so nothing after it
// needs a delimiter and nothing in it is ever decoded; every field before it
// is free of newlines (checked), so the fields cannot be shifted into one another.
function signedBytes(method: string, endpoint: string, t: number, n: string, body: Uint8Array): Uint8Array<ArrayBuffer> {
  const head = encoder.encode(`outlive-nudge-${SIGNATURE_VERSION}\n${method.toUpperCase()}\n${endpoint}\n${t}\n${n}\n`);
  const bytes = new Uint8Array(head.byteLength + body.byteLength);
  bytes.set(head, 0);
  bytes.set(body, head.byteLength);
  return bytes;
}

function bytesOf(body: string | Uint8Array | ArrayBuffer): Uint8Array {
  if (typeof body === 'string') return encoder.encode(body);
  // isView rather than instanceof: a body may come from another realm (a test harness, a Worker's).
  return ArrayBuffer.isView(body) ? new Uint8Array(body.buffer, body.byteOffset, body.byteLength) : new Uint8Array(body);
}

/**
 * Signs a drain request for an endpoint (the drain's URL, or an endpoint id
 * it answers as; see {@link canonicalEndpoint}) and its body, and returns the
 * value of the {@link SIGNATURE_HEADER} header to send with it. A string body
 * is signed as its UTF-8 bytes, which is what `fetch` sends for it; send
 * exactly the bytes signed.
 */
export async function signNudge(secret: string, endpoint: string, body: string | Uint8Array, options: SignOptions = {}): Promise<string> {
  checkSecret(secret);
  const e = canonicalEndpoint(endpoint);
  const t = (options.now ?? new Date()).getTime();
  const n = options.nonce ?? newNonce();
  if (!NONCE_PATTERN.test(n)) throw new ConfigError('outlive: a nudge nonce must be 16-128 characters of A-Z a-z 0-9 _ -');
  const method = options.method ?? 'POST';
  const mac = await globalThis.crypto.subtle.sign('HMAC', await hmacKey(secret), signedBytes(method, e, t, n, bytesOf(body)));
  return `t=${t},n=${n},e=${encodeURIComponent(e)},${SIGNATURE_VERSION}=${base64url(mac)}`;
}

/**
 * Why a drain request was refused: no header (`missing`), an unreadable one
 * (`malformed`), the v1 format of older apps (`outdated`), a MAC that does
 * not match (`wrong`), signed for an endpoint this drain does not answer as
 * (`misdirected`), too old or too far ahead (`stale`), or a nonce already
 * spent (`replayed`).
 */
export type RejectReason = 'missing' | 'malformed' | 'outdated' | 'wrong' | 'misdirected' | 'stale' | 'replayed';

/** The outcome of checking a signature; `endpoint` is the canonical endpoint it was signed for, once the MAC matched. */
export type Verification =
  | { ok: true; timestamp: Date; nonce: string; endpoint: string }
  | { ok: false; reason: RejectReason; endpoint?: string };

/** The request a signature is checked against, as it arrived. */
export interface SignedRequest {
  /** Its method (the drain serves `POST` only). */
  method: string;
  /**
   * The endpoints the verifier answers as, URLs or ids (canonicalised here):
   * the public URLs the senders sign for. The URL a request arrived at will
   * do only where the platform routed it by its host (Workers, Vercel); a
   * self-hosted server builds it from the client's Host header, which could
   * name another deployment sharing the secret. An entry that is neither a
   * URL nor an id throws {@link ConfigError}.
   */
  endpoints: readonly string[];
  /** Its body, as the bytes received: never a decoded and re-encoded string. */
  body: Uint8Array | ArrayBuffer;
}

/** Options of {@link verifySignature} and {@link verifyNudge}. */
export interface VerifyOptions {
  /** The verifier's clock; default now. */
  now?: Date;
  /** How far the signed timestamp may be from `now`. Default {@link DEFAULT_TOLERANCE_MS}. */
  toleranceMs?: number;
}

type Parsed = { t: number; n: string; e: string; mac: Uint8Array<ArrayBuffer> };

function parseHeader(header: string): Parsed | 'outdated' | null {
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
  if (!t || !/^\d{1,16}$/.test(t) || !n || !NONCE_PATTERN.test(n)) return null;
  const v2 = fields.get(SIGNATURE_VERSION);
  // A well-formed header of the old format is told apart from garbage, so its sender learns the fix.
  if (!v2) return fields.has('v1') ? 'outdated' : null;
  let e: string;
  try {
    e = decodeURIComponent(fields.get('e') ?? '');
  } catch {
    return null;
  }
  if (!SIGNED_ENDPOINT_PATTERN.test(e)) return null;
  const mac = fromBase64url(v2);
  if (!mac || mac.length !== 32) return null;
  return { t: Number(t), n, e, mac };
}

function answersAs(signed: string, endpoints: readonly string[]): string | null {
  let canonical: string;
  try {
    canonical = canonicalEndpoint(signed);
  } catch {
    return null;
  }
  return endpoints.some((e) => canonicalEndpoint(e) === canonical) ? canonical : null;
}

/**
 * Checks a signature header against the request (its method, the endpoints
 * the verifier answers as, its body bytes) and the shared secret, without
 * the replay check (which needs the database; see {@link verifyNudge}). The
 * MAC is compared by `crypto.subtle.verify`, in constant time.
 *
 * v1 signatures (`v1=`, over `<t>.<nonce>.<body>`) are refused as
 * `outdated`, not verified: they name no endpoint, so accepting them would
 * keep open the cross-deployment replay v2 closes for as long as they were
 * accepted, to anyone who captured or kept one. A refused nudge is harmless
 * (the next cron tick runs its task), so an app older than its drain during
 * a rolling deploy only waits for the tick until it is updated too.
 */
export async function verifySignature(
  secret: string,
  header: string | null | undefined,
  request: SignedRequest,
  options: VerifyOptions = {},
): Promise<Verification> {
  checkSecret(secret);
  if (!header) return { ok: false, reason: 'missing' };
  const parsed = parseHeader(header);
  if (parsed === 'outdated') return { ok: false, reason: 'outdated' };
  if (!parsed) return { ok: false, reason: 'malformed' };
  const valid = await globalThis.crypto.subtle.verify(
    'HMAC',
    await hmacKey(secret),
    parsed.mac,
    signedBytes(request.method, parsed.e, parsed.t, parsed.n, bytesOf(request.body)),
  );
  if (!valid) return { ok: false, reason: 'wrong' };
  // Checked after the MAC, so only the holder of the secret learns about endpoints and clocks.
  const endpoint = answersAs(parsed.e, request.endpoints);
  if (endpoint === null) return { ok: false, reason: 'misdirected', endpoint: parsed.e };
  const now = (options.now ?? new Date()).getTime();
  if (Math.abs(now - parsed.t) > (options.toleranceMs ?? DEFAULT_TOLERANCE_MS)) return { ok: false, reason: 'stale', endpoint };
  return { ok: true, timestamp: new Date(parsed.t), nonce: parsed.n, endpoint };
}

// Records a nonce as used; zero rows back means it was used before. The same
// statement prunes nonces whose timestamps any verifier now rejects as stale
// (they expire at timestamp + 2 x tolerance, so verifiers whose clocks differ
// by less than the tolerance agree). Both times come from the verifier's
// clock, the one the staleness check used, never mixed with the database's.
export const USE_NONCE_SQL = `
WITH pruned AS (
  DELETE FROM outlive.used_nonces WHERE expires_at OPERATOR(pg_catalog.<) $3::timestamptz
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
export async function useNonce(db: Transactional, nonce: string, timestamp: Date, options: VerifyOptions = {}): Promise<boolean> {
  const tolerance = options.toleranceMs ?? DEFAULT_TOLERANCE_MS;
  const expires = new Date(timestamp.getTime() + 2 * tolerance);
  const rows = await toExecutor(db).query(USE_NONCE_SQL, [nonce, expires, options.now ?? new Date()]);
  return rows.length === 1;
}

/**
 * Verifies a drain request: its signature (the {@link SIGNATURE_HEADER}
 * header's value) over the request's method, endpoint and body bytes, its
 * freshness, and that its nonce has not been used. The nonce is spent only
 * when the signature is valid, meant for this endpoint and fresh, so forged,
 * misdirected or stale requests cannot fill the table.
 *
 * `db` is where the nonce is spent, as the rest of the API takes a database:
 * a pg `Pool` or client, Neon's `Pool`, or a drizzle database, outside a
 * transaction (the nonce must commit on its own, whatever the caller does
 * next). Its role needs the grants of `outlive.used_nonces` (`outlive grants`).
 *
 * Status to answer with when it fails: 401 for `missing`, `malformed`,
 * `outdated`, `wrong`, `misdirected` and `stale`; 403 for `replayed` (well
 * signed, but spent).
 *
 * ```ts
 * const verified = await verifyNudge(pool, secret, request.headers.get(SIGNATURE_HEADER), {
 *   method: request.method,
 *   endpoints: ['https://jobs.example.com/hooks/rebuild'], // what the sender signs for, never the Host header
 *   body: new Uint8Array(await request.arrayBuffer()),
 * });
 * ```
 */
export async function verifyNudge(
  db: Transactional,
  secret: string,
  signature: string | null | undefined,
  request: SignedRequest,
  options: VerifyOptions = {},
): Promise<Verification> {
  const verification = await verifySignature(secret, signature, request, options);
  if (!verification.ok) return verification;
  const fresh = await useNonce(db, verification.nonce, verification.timestamp, options);
  return fresh ? verification : { ok: false, reason: 'replayed', endpoint: verification.endpoint };
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
  /**
   * The endpoint to sign for, when it is not the URL sent to: an endpoint id
   * the drain answers as (its `OUTLIVE_DRAIN_URL`), or its public URL when
   * the request goes another way (a service binding). Default the URL.
   */
  endpoint?: string;
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
 * It throws {@link ConfigError} only for a secret that is too short, a URL
 * that is not absolute, or an `endpoint` option that is neither a URL nor an id.
 *
 * The signature covers the URL it is sent to (or `options.endpoint`), so the
 * drain must answer as that URL: on Workers and Vercel it takes the URL a
 * request arrives at, and `OUTLIVE_DRAIN_URL` on the drain lists others when
 * a proxy or a rewrite changes it; a self-hosted drain answers only as the
 * URLs `OUTLIVE_DRAIN_URL` lists, so nudge one of those.
 */
export async function nudge(url: string, secret: string, body: string | object = '', options: NudgeOptions = {}): Promise<NudgeResult> {
  // Configuration mistakes throw: a nudge that can never be delivered is a bug, not a lost message.
  checkSecret(secret);
  let endpoint: string;
  try {
    new URL(url);
    endpoint = canonicalEndpoint(options.endpoint ?? url);
  } catch {
    throw new ConfigError(
      options.endpoint === undefined
        ? 'outlive: nudge needs the absolute URL of the drain endpoint, such as https://jobs.example.com/drain'
        : 'outlive: nudge needs the absolute URL of the drain endpoint, and an endpoint option that is an absolute http(s) URL or an id of letters, digits, _ and -',
    );
  }
  try {
    // Encoded once: the bytes signed are the bytes sent.
    const bytes = encoder.encode(typeof body === 'string' ? body : JSON.stringify(body));
    const headers: Record<string, string> = {
      'content-type': typeof body === 'string' ? 'text/plain;charset=UTF-8' : 'application/json',
      [SIGNATURE_HEADER]: await signNudge(secret, endpoint, bytes, { method: 'POST' }),
    };
    if (options.respondAsync !== false) headers['prefer'] = 'respond-async';
    const response = await (options.fetch ?? globalThis.fetch)(url, {
      method: 'POST',
      headers,
      body: bytes,
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
