/**
 * The signal endpoint: `POST /signal`, where a third party (a provider's
 * webhook: "your response is ready", "the domain is verified") or the app
 * itself sends a signal that ends the steps waiting on its key (`waitFor`),
 * then a pass runs so they resume now rather than at the next cron tick.
 *
 * It accepts one of two signatures, told apart by their headers:
 *
 * - **Standard Webhooks** (standardwebhooks.com), what providers send:
 *   `webhook-id`, `webhook-timestamp` (unix seconds) and `webhook-signature`
 *   (space-separated `v1,<base64 HMAC-SHA256>` entries; any one matching
 *   passes) over `<id>.<timestamp>.<body bytes>`, keyed with a secret of
 *   {@link SIGNAL_SECRETS_SETTING} (several: rotation, several providers).
 *   The timestamp must be within 5 minutes of the clock either way. The
 *   `webhook-id` is the signal's id, so a delivery sent again changes nothing.
 *   The body becomes a signal through the route's `toSignal`, by default
 *   `{ key, payload }`.
 * - **outlive's own v2 signature** (`Outlive-Signature`, what `nudge()`
 *   sends), keyed with `OUTLIVE_DRAIN_SECRET` and signed for this endpoint
 *   (the request's URL, or those {@link SIGNAL_URL_SETTING} lists), its nonce
 *   spent once; the body is `{ key, payload, id? }`. An app sends one with
 *   `nudge(signalUrl, secret, { key, payload, id })`.
 *
 * Refusals write nothing: 405 for another method, 413 for a body over
 * {@link MAX_SIGNAL_BODY_BYTES}, 401 (with `www-authenticate`) for a
 * missing, malformed, wrong, stale or replayed signature, 400 for a body
 * that is not JSON or a signal `signal` refuses, 500 when no secret is
 * configured. A verified call answers 200: `{ ignored: true }` when
 * `toSignal` maps it to nothing, else `{ delivered, duplicate }`.
 */
import { ConfigError, toError } from '../model/errors.js';
import { MAX_OUTPUT_BYTES } from '../model/json.js';
import { InvalidSignalError, signal, type SignalResult } from '../write/signal.js';
import type { TickReport } from '../pass/tick.js';
import { answeringEndpoints, readBody } from './drain.js';
import {
  checkSecret,
  fromBase64,
  SIGNATURE_HEADER,
  verifyNudge,
  type RejectReason,
} from './nudge.js';
import { json, runPass, type FunctionsEnv, type Invocation } from './invocation.js';

/** The setting that holds the Standard Webhooks signing secrets, comma- or space-separated. */
export const SIGNAL_SECRETS_SETTING = 'OUTLIVE_SIGNAL_SECRETS';

/** The setting that names the endpoints outlive-signed (v2) signals are signed for, as `OUTLIVE_DRAIN_URL` does for the drain. */
export const SIGNAL_URL_SETTING = 'OUTLIVE_SIGNAL_URL';

/** Largest signal body read: a payload's 1 MiB, and 64 KiB for the envelope around it. */
export const MAX_SIGNAL_BODY_BYTES = MAX_OUTPUT_BYTES + 65_536;

/** How far a Standard Webhooks timestamp may be from the clock, either way: 5 minutes, as the spec recommends. */
export const STANDARD_WEBHOOKS_TOLERANCE_MS = 300_000;

/** Most entries read from one `webhook-signature` header; each costs an HMAC of the body per secret. */
export const MAX_SIGNATURES = 10;

/** Shortest signing key accepted (bytes); Standard Webhooks secrets are 24 to 64. */
export const MIN_SIGNAL_SECRET_BYTES = 16;

const SECRET_PREFIX = 'whsec_';
const encoder = new TextEncoder();
// Fatal: a verified body that is not UTF-8 is refused, not read with U+FFFD in its place.
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** What `toSignal` is given: a call whose signature verified. */
export interface SignalCall {
  /** The body, parsed as JSON. */
  body: unknown;
  headers: Headers;
  /** The call's `webhook-id`: the signal's id, so a redelivery is one signal. */
  id: string;
}

/** The signal a call becomes: its key, and the payload the waiting steps get as their output. */
export interface SignalFromCall {
  key: string;
  payload?: unknown;
}

/**
 * Maps a verified Standard Webhooks call to a signal, or to null for an
 * event the app does not wait for (answered 200 `{ ignored: true }`).
 *
 * ```ts
 * // OpenAI's { type: 'response.completed', data: { id: 'resp_1' } } ends waitFor('openai:resp_1').
 * toSignal: ({ body }) => {
 *   const event = body as { type: string; data: { id: string } };
 *   return event.type.startsWith('response.') ? { key: `openai:${event.data.id}`, payload: event } : null;
 * }
 * ```
 */
export type ToSignal = (call: SignalCall) => SignalFromCall | null | Promise<SignalFromCall | null>;

/** Options of the signal endpoint, on either platform. */
export interface SignalRouteOptions {
  /**
   * The Standard Webhooks signing secrets (`whsec_<base64>`, or a raw
   * secret taken as its UTF-8 bytes); any one verifying passes. Default:
   * those {@link SIGNAL_SECRETS_SETTING} lists.
   */
  secrets?: readonly string[];
  /** Maps a verified Standard Webhooks call to a signal. Default: the body is `{ key, payload }`. */
  toSignal?: ToSignal;
}

/** Why a call's signature was refused (all answered 401). */
export type SignalRejectReason = RejectReason | 'unconfigured';

/** The outcome of checking a Standard Webhooks signature. */
export type WebhookVerification =
  | { ok: true; id: string; timestamp: Date }
  | { ok: false; reason: 'missing' | 'malformed' | 'wrong' | 'stale'; detail: string };

/**
 * The HMAC key of one signing secret: the base64 after `whsec_`, decoded, or
 * a secret without the prefix as its UTF-8 bytes. Throws {@link ConfigError}
 * naming `where`, never the secret.
 */
export function signingKey(secret: string, where = 'a signal secret'): Uint8Array<ArrayBuffer> {
  if (typeof secret !== 'string' || secret.trim() === '') throw new ConfigError(`outlive: ${where} must be a non-empty string`);
  let key: Uint8Array<ArrayBuffer>;
  if (secret.startsWith(SECRET_PREFIX)) {
    const decoded = fromBase64(secret.slice(SECRET_PREFIX.length));
    if (!decoded) throw new ConfigError(`outlive: ${where} is not base64 after its ${SECRET_PREFIX} prefix: copy the signing secret whole, as the provider shows it`);
    key = decoded;
  } else {
    key = encoder.encode(secret);
  }
  if (key.byteLength < MIN_SIGNAL_SECRET_BYTES) {
    throw new ConfigError(`outlive: ${where} is a key of ${key.byteLength} bytes, under the ${MIN_SIGNAL_SECRET_BYTES} accepted: use the provider's ${SECRET_PREFIX} secret`);
  }
  return key;
}

/**
 * Reads a list of signing secrets, comma- or space-separated, as
 * {@link SIGNAL_SECRETS_SETTING} holds them; empty for an empty list. Throws
 * {@link ConfigError} naming the setting and the entry's place, never a value.
 */
export function parseSignalSecrets(list: string, name: string = SIGNAL_SECRETS_SETTING): string[] {
  const entries = list.split(/[\s,]+/).filter((e) => e !== '');
  entries.forEach((e, i) => signingKey(e, `entry ${i + 1} of ${name}`));
  return entries;
}

function importKey(secret: string): Promise<CryptoKey> {
  return globalThis.crypto.subtle.importKey('raw', signingKey(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['verify']);
}

/**
 * Checks a Standard Webhooks signature: the `webhook-id`,
 * `webhook-timestamp` and `webhook-signature` headers over the exact body
 * bytes, against each secret (any one verifying passes). Entries other than
 * `v1,` (such as the asymmetric `v1a,`) are skipped. Each MAC is compared by
 * `crypto.subtle.verify`, in constant time; the timestamp is checked after
 * the MAC, so only the holder of a secret learns about clocks.
 */
export async function verifyStandardWebhook(
  secrets: readonly string[],
  headers: Headers,
  body: Uint8Array | string,
  options: { now?: Date; toleranceMs?: number } = {},
): Promise<WebhookVerification> {
  const keys = await Promise.all(secrets.map(importKey));
  const id = headers.get('webhook-id');
  const timestamp = headers.get('webhook-timestamp');
  const signature = headers.get('webhook-signature');
  const absent = [!id && 'webhook-id', !timestamp && 'webhook-timestamp', !signature && 'webhook-signature'].filter(Boolean);
  if (absent.length) return { ok: false, reason: 'missing', detail: `missing signature: no ${absent.join(', ')} header` };
  if (!/^\d{1,12}$/.test(timestamp!)) return { ok: false, reason: 'malformed', detail: 'malformed signature: webhook-timestamp must be unix seconds' };
  const entries = signature!.split(' ').filter((e) => e !== '');
  if (entries.length === 0 || entries.length > MAX_SIGNATURES || entries.some((e) => !e.includes(','))) {
    return { ok: false, reason: 'malformed', detail: `malformed signature: webhook-signature must be 1 to ${MAX_SIGNATURES} space-separated entries like v1,<base64>` };
  }
  const macs = entries
    .filter((e) => e.slice(0, e.indexOf(',')) === 'v1')
    .map((e) => fromBase64(e.slice(e.indexOf(',') + 1)))
    .filter((mac): mac is Uint8Array<ArrayBuffer> => mac !== null && mac.byteLength === 32);
  const bytes = typeof body === 'string' ? encoder.encode(body) : body;
  const head = encoder.encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(head.byteLength + bytes.byteLength);
  signed.set(head, 0);
  signed.set(bytes, head.byteLength);
  let valid = false;
  for (const key of keys) {
    for (const mac of macs) if (await globalThis.crypto.subtle.verify('HMAC', key, mac, signed)) valid = true;
  }
  if (!valid) return { ok: false, reason: 'wrong', detail: 'signature does not match: no v1 entry verifies with a configured secret' };
  const at = Number(timestamp) * 1_000;
  const now = (options.now ?? new Date()).getTime();
  const tolerance = options.toleranceMs ?? STANDARD_WEBHOOKS_TOLERANCE_MS;
  if (Math.abs(now - at) > tolerance) {
    return { ok: false, reason: 'stale', detail: `signature timestamp is outside the allowed window: webhook-timestamp is more than ${tolerance / 1_000} s from now` };
  }
  return { ok: true, id: id!, timestamp: new Date(at) };
}

/** The signal endpoint's settings, read and checked; throws ConfigError naming a setting, never a value. */
interface SignalSettings {
  secrets: readonly string[];
  /** OUTLIVE_DRAIN_SECRET, for outlive-signed calls; null when it is not set. */
  drainSecret: string | null;
  endpoints: string[];
}

/** Checks options given in code at once (a secret that cannot be a key, a `toSignal` that is not a function), naming `where`. */
export function checkSignalRouteOptions(options: SignalRouteOptions, where: string): SignalRouteOptions {
  options.secrets?.forEach((s, i) => signingKey(s, `secrets[${i}] of ${where}`));
  if (options.toSignal !== undefined && typeof options.toSignal !== 'function') throw new ConfigError(`outlive: ${where}: toSignal must be a function`);
  return options;
}

function settingsOf(request: Request, inv: Invocation, options: SignalRouteOptions): SignalSettings {
  const env = inv.env;
  // Secrets given in code were checked when the route was made (checkSignalRouteOptions).
  let secrets: readonly string[];
  if (options.secrets !== undefined) secrets = options.secrets;
  else {
    const listed = env[SIGNAL_SECRETS_SETTING];
    if (listed !== undefined && typeof listed !== 'string') throw new ConfigError(`outlive: ${SIGNAL_SECRETS_SETTING} must be a string`);
    secrets = parseSignalSecrets(listed ?? '');
  }
  const drain = env.OUTLIVE_DRAIN_SECRET;
  const drainSecret = drain === undefined || drain === '' ? null : checkSecret(drain);
  if (secrets.length === 0 && drainSecret === null) {
    throw new ConfigError(
      `outlive: the signal endpoint has no secret: set ${SIGNAL_SECRETS_SETTING} to the providers' whsec_ signing secrets, ` +
        'or OUTLIVE_DRAIN_SECRET for signals the app signs',
    );
  }
  // Self-hosted without OUTLIVE_SIGNAL_URL: no endpoint, so outlive-signed calls are refused (providers' are not bound to a URL).
  return { secrets, drainSecret, endpoints: answeringEndpoints(request, inv, SIGNAL_URL_SETTING) };
}

const REASONS: Record<SignalRejectReason, string> = {
  missing: `missing signature: send webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks) or ${SIGNATURE_HEADER}`,
  malformed: 'malformed signature',
  outdated: `${SIGNATURE_HEADER} is v1, which this endpoint does not accept: update outlive in the app that signs`,
  wrong: 'signature does not match',
  misdirected: `signature is for another endpoint: sign for the URL this endpoint answers as, or set ${SIGNAL_URL_SETTING} to the URL the app signs for (a self-hosted endpoint must set it)`,
  stale: 'signature timestamp is outside the allowed window',
  replayed: 'signature was already used',
  unconfigured: 'this endpoint has no secret for this kind of signature',
};

function refuse(reason: SignalRejectReason, challenge: string, detail?: string): Response {
  return json(401, { error: detail ?? REASONS[reason] }, { 'www-authenticate': challenge });
}

/** A body of JSON, or a message saying why not. */
function parseJson(bytes: Uint8Array): { value: unknown } | { error: string } {
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    return { error: 'body must be UTF-8' };
  }
  try {
    return { value: JSON.parse(text) };
  } catch {
    return { error: 'body must be JSON' };
  }
}

/** Reads `{ key, payload }` (and `id` where `allowed` has it) from a body; throws InvalidSignalError naming the fix. */
function envelope(body: unknown, allowed: readonly string[]): { key: string; payload: unknown; id?: string } {
  const shape = `{ ${allowed.join(', ')} }`;
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new InvalidSignalError(`outlive: signal: body must be a JSON object ${shape}`);
  const unknown = Object.keys(body).filter((k) => !allowed.includes(k));
  if (unknown.length) {
    throw new InvalidSignalError(`outlive: signal: unknown field(s) ${unknown.join(', ')} in the body: send ${shape}, or give the route a toSignal that maps this body`);
  }
  const { key, payload, id } = body as { key?: unknown; payload?: unknown; id?: unknown };
  if (typeof key !== 'string') throw new InvalidSignalError(`outlive: signal: body must be ${shape} with a string key`);
  if (id !== undefined && typeof id !== 'string') throw new InvalidSignalError('outlive: signal: id must be a string');
  return id === undefined ? { key, payload } : { key, payload, id };
}

/**
 * Handles one call of the signal endpoint on an open invocation; never
 * throws. After a signal that ended waits, a pass runs: in the background
 * where the platform allows it (Workers' `ctx.waitUntil`, Vercel's
 * `waitUntil`), answering at once; else bounded, before answering.
 */
export async function handleSignal(request: Request, inv: Invocation, options: SignalRouteOptions = {}): Promise<Response> {
  if (request.method !== 'POST') return json(405, { error: 'use POST' }, { allow: 'POST' });
  let settings: SignalSettings;
  try {
    settings = settingsOf(request, inv, options);
  } catch (err) {
    inv.log('signal-misconfigured', { error: toError(err).message });
    return json(500, { error: 'the signal endpoint is not configured' });
  }
  let body: Uint8Array | null;
  try {
    body = await readBody(request, MAX_SIGNAL_BODY_BYTES);
  } catch {
    return json(400, { error: 'could not read the body' });
  }
  if (body === null) return json(413, { error: `body too large: at most ${MAX_SIGNAL_BODY_BYTES} bytes` });

  const headers = request.headers;
  const standard = headers.has('webhook-id') || headers.has('webhook-timestamp') || headers.has('webhook-signature');
  const scheme = standard ? 'standard-webhooks' : headers.has(SIGNATURE_HEADER) ? 'outlive' : null;
  const rejected = (reason: SignalRejectReason, challenge: string, detail?: string) => {
    inv.log('signal-rejected', { scheme, reason });
    return refuse(reason, challenge, detail);
  };
  if (scheme === null) return rejected('missing', `webhook-signature, ${SIGNATURE_HEADER}`);

  let id: string | undefined;
  let found: SignalFromCall | null;
  try {
    if (scheme === 'standard-webhooks') {
      if (settings.secrets.length === 0) return rejected('unconfigured', 'webhook-signature');
      const verification = await verifyStandardWebhook(settings.secrets, headers, body);
      if (!verification.ok) return rejected(verification.reason, 'webhook-signature', verification.detail);
      id = verification.id;
      const parsed = parseJson(body);
      if ('error' in parsed) return json(400, { error: parsed.error });
      if (options.toSignal) {
        try {
          found = await options.toSignal({ body: parsed.value, headers, id });
        } catch (err) {
          inv.log('signal-mapping-error', { error: toError(err).message });
          return json(500, { error: 'toSignal failed' });
        }
        if (found !== null && (typeof found !== 'object' || Array.isArray(found))) {
          inv.log('signal-mapping-error', { error: 'toSignal must return { key, payload } or null' });
          return json(500, { error: 'toSignal failed' });
        }
      } else {
        found = envelope(parsed.value, ['key', 'payload']);
      }
    } else {
      if (settings.drainSecret === null) return rejected('unconfigured', SIGNATURE_HEADER);
      const verification = await verifyNudge(inv.pool, settings.drainSecret, headers.get(SIGNATURE_HEADER), {
        method: request.method,
        endpoints: settings.endpoints,
        body,
      });
      if (!verification.ok) return rejected(verification.reason, SIGNATURE_HEADER);
      const parsed = parseJson(body);
      if ('error' in parsed) return json(400, { error: parsed.error });
      const sent = envelope(parsed.value, ['key', 'payload', 'id']);
      id = sent.id;
      found = sent;
    }
  } catch (err) {
    if (err instanceof InvalidSignalError) return json(400, { error: err.message });
    inv.log('signal-verify-error', { scheme, error: toError(err).message });
    return json(500, { error: 'could not verify the request' });
  }
  if (found === null) {
    inv.log('signal-ignored', { scheme, id });
    return json(200, { ignored: true });
  }

  let result: SignalResult;
  try {
    result = await signal(inv.pool, found.key, found.payload, id === undefined ? {} : { id });
  } catch (err) {
    if (err instanceof InvalidSignalError) return json(400, { error: err.message });
    inv.log('signal-error', { scheme, error: toError(err).message });
    return json(500, { error: 'could not send the signal' });
  }
  inv.log('signal', { scheme, key: found.key, ...(id === undefined ? {} : { id }), ...result });
  // A redelivery (a provider that saw our answer late sends the same webhook-id again) is
  // acknowledged, not refused: a 4xx would have it retry, then disable the endpoint.
  if (result.delivered === 0) return json(200, result);

  if (inv.background) {
    inv.background(runPass(inv, 'drain'));
    return json(200, result);
  }
  let report: TickReport | undefined;
  try {
    report = await runPass(inv, 'drain');
  } catch {
    // The signal is committed and the pass's failure logged (redacted): the next tick resumes the waits.
  }
  return json(200, { ...result, ...(report ? { report } : {}) });
}
