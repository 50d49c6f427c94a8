/**
 * Who may see the dashboard: whoever holds its token. The token arrives as
 * `Authorization: Bearer <token>` (scripts), or once as `?token=` which the
 * dashboard trades for an HttpOnly, SameSite=Strict session cookie and a
 * redirect that drops it from the address bar. The cookie holds an HMAC of
 * the token, never the token itself. Forms carry a per-token CSRF value, and
 * a browser's POST must also come from the dashboard's own origin.
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

/** The session cookie's value for a token. */
export function sessionValue(token: string): Promise<string> {
  return hmac(token, 'outlive-dashboard-session');
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

/** Checks a request's bearer token or session cookie against the token, in constant time. */
export async function credentialOf(request: Request, token: string): Promise<Credential> {
  const auth = request.headers.get('authorization');
  if (auth && /^Bearer /i.test(auth) && secretsEqual(auth.slice(7).trim(), token)) return 'bearer';
  const session = cookie(request, COOKIE_NAME);
  if (session && secretsEqual(session, await sessionValue(token))) return 'cookie';
  return null;
}

/** The `Set-Cookie` header that opens a session. */
export async function sessionCookie(token: string, basePath: string, secure: boolean): Promise<string> {
  return `${COOKIE_NAME}=${await sessionValue(token)}; Path=${basePath || '/'}; HttpOnly; SameSite=Strict; Max-Age=43200${secure ? '; Secure' : ''}`;
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
