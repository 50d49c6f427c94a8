/**
 * The drain webhook: `POST /drain`, signed by the app's nudge after it
 * enqueued something, runs a bounded pass at once instead of at the next
 * cron tick.
 *
 * Refusals run nothing and touch no task row: 401 for a missing, malformed,
 * wrong or stale signature, 403 for a replayed one, 413 for a body too large
 * to be a nudge. With `Prefer: respond-async` (what `nudge()` sends) and a
 * platform that can keep working after the response (Workers), it answers
 * 202 at once and runs the pass in the background; otherwise it answers 200
 * with the pass's report when the pass is done.
 */
import { ConfigError, toError } from '../model/errors.js';
import { toExecutor } from '../db/executor.js';
import { checkSecret, rejectStatus, SIGNATURE_HEADER, verifyNudge, type RejectReason, type Verification } from './nudge.js';
import { checkName } from '../model/checks.js';
import { PassError } from '../pass/tick.js';
import { json, runPass, type Invocation } from './invocation.js';

/** Largest drain body read: 64 KiB. A nudge's body is a few bytes of JSON at most. */
export const MAX_DRAIN_BODY_BYTES = 65_536;

const REASONS: Record<RejectReason, string> = {
  missing: `missing ${SIGNATURE_HEADER} header`,
  malformed: `malformed ${SIGNATURE_HEADER} header`,
  wrong: 'signature does not match',
  stale: 'signature timestamp is outside the allowed window',
  replayed: 'signature was already used',
};

/** Reads the signed body: empty, or JSON `{ "queues": ["a", "b"] }` to drain only those queues. */
function parseBody(body: string): { queues?: string[] } {
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

/** Reads the body as text, or null once it passes {@link MAX_DRAIN_BODY_BYTES} (read no further). */
async function readBody(request: Request): Promise<string | null> {
  if (Number(request.headers.get('content-length') ?? 0) > MAX_DRAIN_BODY_BYTES) return null;
  if (!request.body) return '';
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > MAX_DRAIN_BODY_BYTES) {
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
  return new TextDecoder().decode(all);
}

function prefersAsync(request: Request): boolean {
  return /(^|,)\s*respond-async\s*(;|,|$)/i.test(request.headers.get('prefer') ?? '');
}

/** Handles one drain request on an open invocation; never throws. */
export async function handleDrain(request: Request, inv: Invocation): Promise<Response> {
  if (request.method !== 'POST') return json(405, { error: 'use POST' }, { allow: 'POST' });
  const secret = inv.env.OUTLIVE_DRAIN_SECRET;
  try {
    checkSecret(secret);
  } catch (err) {
    inv.log('drain-misconfigured', { error: toError(err).message });
    return json(500, { error: 'the drain endpoint is not configured' });
  }
  let body: string | null;
  try {
    body = await readBody(request);
  } catch {
    return json(400, { error: 'could not read the body' });
  }
  if (body === null) return json(413, { error: 'body too large' });

  let verification: Verification;
  try {
    verification = await verifyNudge(toExecutor(inv.pool), secret as string, request.headers.get(SIGNATURE_HEADER), body);
  } catch (err) {
    inv.log('drain-verify-error', { error: toError(err).message });
    return json(500, { error: 'could not verify the request' });
  }
  if (!verification.ok) {
    inv.log('drain-rejected', { reason: verification.reason });
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
