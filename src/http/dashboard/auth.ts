/**
 * Who may see the dashboard: whoever holds its token. The token arrives as
 * `Authorization: Bearer <token>` (scripts), or once as `?token=` which the
 * dashboard trades for an HttpOnly, SameSite=Strict session cookie and a
 * redirect that drops it from the address bar. The cookie holds when it was
 * issued, a nonce and an HMAC of both under the token (never the token), and
 * expires: the server refuses it past its age, whatever the browser keeps.
 * Forms carry a per-token CSRF value, and a browser's POST must also come
 * from the dashboard's own origin.
 */
import { secretsEqual } from '../nudge.js';

/** The session cookie's name. */
export const COOKIE_NAME = 'outlive_dashboard';

const encoder = new TextEncoder();

async function hmac(key: string, message: string): Promise<string> {
  const k = await crypto.subtle.importKey('raw', encoder.encode(key), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const sig = new Uint8Array(await crypto.subtle.sign('HMAC', k, encoder.encode(message)));
  let s = '';
  for (const b of sig) s += b.toString(16).padStart(2, '0');
  return s;
}

/** How long a session lasts unless the dashboard is told otherwise: 12 hours, in seconds. */
export const DEFAULT_SESSION_SECONDS = 43_200;

/** How far in the future a session's issue time may be, for clocks of two instances that disagree (ms). */
const CLOCK_SKEW_MS = 60_000;

/**
 * A new session's cookie value: `issuedAt.nonce.mac`, the issue time in
 * seconds, a random nonce, and an HMAC of both under the token. Each login
 * gets its own, and none can be computed from the token alone ahead of time.
 */
export async function sessionValue(token: string, now = Date.now()): Promise<string> {
  const issued = `${Math.floor(now / 1000)}.${crypto.randomUUID().replaceAll('-', '')}`;
  return `${issued}.${await hmac(token, `outlive-dashboard-session:${issued}`)}`;
}

/** True for a session value this token issued no more than `maxAgeSeconds` ago. */
export async function validSession(value: string, token: string, maxAgeSeconds: number, now = Date.now()): Promise<boolean> {
  const m = /^([0-9]{1,12})\.([0-9a-f]{32})\.([0-9a-f]{64})$/.exec(value);
  if (!m) return false;
  const issuedMs = Number(m[1]) * 1000;
  if (issuedMs > now + CLOCK_SKEW_MS || now - issuedMs > maxAgeSeconds * 1000) return false;
  return secretsEqual(m[3]!, await hmac(token, `outlive-dashboard-session:${m[1]}.${m[2]}`));
}

/** The CSRF value forms carry for a token. */
export function csrfValue(token: string): Promise<string> {
  return hmac(token, 'outlive-dashboard-csrf');
}

function cookie(request: Request, name: string): string | null {
  for (const part of (request.headers.get('cookie') ?? '').split(';')) {
    const i = part.indexOf('=');
    if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
  }
  return null;
}

/** How a request proved it holds the token, if it did. */
export type Credential = 'bearer' | 'cookie' | null;

/**
 * Checks a request's bearer token (in constant time) or its session cookie
 * (issued by this token, and not older than `sessionSeconds`).
 */
export async function credentialOf(request: Request, token: string, sessionSeconds = DEFAULT_SESSION_SECONDS): Promise<Credential> {
  const auth = request.headers.get('authorization');
  if (auth && /^Bearer /i.test(auth) && secretsEqual(auth.slice(7).trim(), token)) return 'bearer';
  const session = cookie(request, COOKIE_NAME);
  if (session && (await validSession(session, token, sessionSeconds))) return 'cookie';
  return null;
}

/**
 * True when the browser reached the dashboard over TLS: the request's own
 * URL, or, for a request that arrived as plain HTTP, a proxy's
 * `X-Forwarded-Proto: https` in front of it.
 */
export function overTls(request: Request): boolean {
  const protocol = new URL(request.url).protocol;
  if (protocol === 'https:') return true;
  const forwarded = request.headers.get('x-forwarded-proto');
  return protocol === 'http:' && forwarded !== null && forwarded.split(',')[0]!.trim().toLowerCase() === 'https';
}

/** The `Set-Cookie` header that opens a new session; `Secure` when the browser came over TLS. */
export async function sessionCookie(request: Request, token: string, basePath: string, sessionSeconds = DEFAULT_SESSION_SECONDS): Promise<string> {
  const secure = overTls(request) ? '; Secure' : '';
  return `${COOKIE_NAME}=${await sessionValue(token)}; Path=${basePath || '/'}; HttpOnly; SameSite=Strict; Max-Age=${sessionSeconds}${secure}`;
}

/**
 * True when a cookie-authenticated POST may act: it carries the page's CSRF
 * value, and its Origin (when the browser sends one) is the dashboard's own.
 */
export async function sameSiteForm(request: Request, token: string, form: URLSearchParams): Promise<boolean> {
  const origin = request.headers.get('origin');
  if (origin !== null && origin !== new URL(request.url).origin) return false;
  const presented = form.get('csrf');
  return presented !== null && secretsEqual(presented, await csrfValue(token));
}
