/**
 * The drain webhook: `POST /drain`, signed by the app's nudge after it
 * enqueued something, runs a bounded pass at once instead of at the next
 * cron tick.
 *
 * Refusals run nothing and touch no task row: 401 for a missing, malformed,
 * outdated (v1), wrong, misdirected (signed for another endpoint) or stale
 * signature, 403 for a replayed one, 413 for a body too large to be a nudge.
 *
 * The signature covers the endpoint the nudger meant, checked against the
 * endpoints this drain answers as: the URL the request arrived at (on
 * Workers and Vercel, which route by it), or, when `OUTLIVE_DRAIN_URL` is
 * set, exactly the URLs and endpoint ids it lists (a custom domain in front
 * of a workers.dev host, a Vercel rewrite, a proxy: whatever makes the URL
 * the handler sees differ from the one the app nudges). A self-hosted drain
 * must set it (see `answeringEndpoints`).
 *
 * With `Prefer: respond-async` (what `nudge()` sends) and a platform that can
 * keep working after the response (Workers), it answers 202 at once and runs
 * the pass in the background; otherwise it answers 200 with the pass's report
 * when the pass is done.
 */
import { ConfigError, toError } from '../model/errors.js';
import {
  canonicalEndpoint,
  checkSecret,
  DRAIN_URL_SETTING,
  parseEndpoints,
  rejectStatus,
  SIGNATURE_HEADER,
  verifyNudge,
  type RejectReason,
  type Verification,
} from './nudge.js';
import { checkName } from '../model/checks.js';
import { PassError } from '../pass/tick.js';
import { json, runPass, type Invocation } from './invocation.js';

/** Largest drain body read: 64 KiB. A nudge's body is a few bytes of JSON at most. */
export const MAX_DRAIN_BODY_BYTES = 65_536;

const REASONS: Record<RejectReason, string> = {
  missing: `missing ${SIGNATURE_HEADER} header`,
  malformed: `malformed ${SIGNATURE_HEADER} header`,
  outdated:
    'signature is v1, which this drain no longer accepts: update outlive in the app that sends the nudge ' +
    '(v2 signs the endpoint and the exact body bytes)',
  wrong: 'signature does not match',
  misdirected:
    'signature is for another endpoint: nudge the URL this drain answers as, or, when a proxy or rewrite ' +
    `changes the URL it sees, set ${DRAIN_URL_SETTING} on the drain to the URL the app nudges`,
  stale: 'signature timestamp is outside the allowed window',
  replayed: 'signature was already used',
};

/**
 * The endpoints a signed route answers as: those `setting` lists when it is
 * set; else the URL the request arrived at, but only where the platform
 * routed the request by that URL's host (`inv.routedByHost`). A self-hosted
 * server's request URL carries the client's Host header, so a nudge captured
 * for another deployment sharing the secret would pass with a forged Host:
 * there, nothing is taken from the request and the list is empty. Throws
 * ConfigError (naming the setting, never its value) for a list that is not
 * URLs or ids.
 */
export function answeringEndpoints(request: Request, inv: Pick<Invocation, 'env' | 'routedByHost'>, setting: string): string[] {
  const configured = inv.env[setting];
  if (configured === undefined || configured === '') return inv.routedByHost ? [canonicalEndpoint(request.url, 'the request URL')] : [];
  if (typeof configured !== 'string') throw new ConfigError(`outlive: ${setting} must be a string`);
  return parseEndpoints(configured, setting);
}

// Fatal: a verified body that is not UTF-8 is refused, not read with U+FFFD in its place.
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Reads the signed body: empty, or JSON `{ "queues": ["a", "b"] }` to drain only those queues. */
function parseBody(bytes: Uint8Array): { queues?: string[] } {
  let body: string;
  try {
    body = utf8.decode(bytes);
  } catch {
    throw new ConfigError('body must be UTF-8');
  }
  if (body.trim() === '') return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    throw new ConfigError('body must be empty or JSON');
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new ConfigError('body must be a JSON object');
  const queues = (parsed as { queues?: unknown }).queues;
  if (queues === undefined) return {};
  if (!Array.isArray(queues) || queues.length === 0) throw new ConfigError('queues must be a non-empty array of queue names');
  return { queues: queues.map((q) => checkName('queue', q)) };
}

/**
 * Reads the body as the exact bytes received (what the signature covers), or
 * null once it passes `limit`, default {@link MAX_DRAIN_BODY_BYTES} (read no
 * further). The signal endpoint reads its bodies with it too.
 */
export async function readBody(request: Request, limit: number = MAX_DRAIN_BODY_BYTES): Promise<Uint8Array | null> {
  if (Number(request.headers.get('content-length') ?? 0) > limit) return null;
  if (!request.body) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => undefined);
      return null;
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return all;
}

function prefersAsync(request: Request): boolean {
  return /(^|,)\s*respond-async\s*(;|,|$)/i.test(request.headers.get('prefer') ?? '');
}

/** Handles one drain request on an open invocation; never throws. */
export async function handleDrain(request: Request, inv: Invocation): Promise<Response> {
  if (request.method !== 'POST') return json(405, { error: 'use POST' }, { allow: 'POST' });
  const secret = inv.env.OUTLIVE_DRAIN_SECRET;
  let endpoints: string[];
  try {
    checkSecret(secret);
    endpoints = answeringEndpoints(request, inv, DRAIN_URL_SETTING);
    if (endpoints.length === 0) {
      throw new ConfigError(
        `outlive: set ${DRAIN_URL_SETTING} to the URL the app nudges: off Cloudflare Workers and Vercel the request's Host header ` +
          'is the client\'s to choose, so this drain cannot tell its own URL from it',
      );
    }
  } catch (err) {
    inv.log('drain-misconfigured', { error: toError(err).message });
    return json(500, { error: 'the drain endpoint is not configured' });
  }
  let body: Uint8Array | null;
  try {
    body = await readBody(request);
  } catch {
    return json(400, { error: 'could not read the body' });
  }
  if (body === null) return json(413, { error: 'body too large' });

  let verification: Verification;
  try {
    verification = await verifyNudge(inv.pool, secret as string, request.headers.get(SIGNATURE_HEADER), {
      method: request.method,
      endpoints,
      body,
    });
  } catch (err) {
    inv.log('drain-verify-error', { error: toError(err).message });
    return json(500, { error: 'could not verify the request' });
  }
  if (!verification.ok) {
    // The endpoint signed for is logged only once the MAC matched (the verifier sets it then), so
    // the operator can compare it with the endpoints this drain answers as.
    inv.log('drain-rejected', {
      reason: verification.reason,
      ...(verification.reason === 'misdirected' ? { signedFor: verification.endpoint, answersAs: endpoints } : {}),
    });
    const status = rejectStatus(verification.reason);
    return json(status, { error: REASONS[verification.reason] }, status === 401 ? { 'www-authenticate': SIGNATURE_HEADER } : {});
  }
  let queues: string[] | undefined;
  try {
    queues = parseBody(body).queues;
  } catch (err) {
    return json(400, { error: toError(err).message });
  }
  const options = queues ? { queues } : {};

  if (inv.background && prefersAsync(request)) {
    inv.background(runPass(inv, 'drain', options));
    return json(202, { accepted: true }, { 'preference-applied': 'respond-async' });
  }
  try {
    const report = await runPass(inv, 'drain', options);
    return json(200, { report });
  } catch (err) {
    // The log has the error (redacted); the caller gets the counts only.
    return json(500, { error: 'the pass failed', ...(err instanceof PassError ? { report: err.report } : {}) });
  }
}
