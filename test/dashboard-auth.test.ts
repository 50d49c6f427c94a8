/**
 * Who may use the dashboard, and where it may send them: sessions that
 * change per login and expire on the server's clock, `Secure` behind a TLS
 * proxy, CSRF on a browser's actions, ids no row can have answered 404, and
 * no redirect to another host. `handleDashboard` called with Web requests,
 * against the real database.
 */
import { describe, expect, it } from 'vitest';
import { cancelRun, enqueue, explainRun, retryRun, retryTask, startRun, step, tick } from '../src/index.js';
import { getTask, runEdges } from '../src/admin/queries.js';
import { handleDashboard, type DashboardOptions } from '../src/http/dashboard/index.js';
import { csrfValue, sessionValue } from '../src/http/dashboard/auth.js';
import { freshDb } from './support/db.js';
import { explode, greet, tasks } from './fixtures/cli-tasks.js';

const db = await freshDb();
const TOKEN = 'dashboard-auth-test-token-0123456789';
const BEYOND_BIGINT = '99999999999999999999';

function dashboard(url: string, init: RequestInit = {}, options: Partial<DashboardOptions> = {}): Promise<Response> {
  return handleDashboard(new Request(url, init), db.pool, { token: TOKEN, log: () => undefined, ...options });
}

/** Opens a session as a browser does (`?token=` once); returns the `Set-Cookie` header. */
async function login(base = 'http://app.test/dashboard', headers: Record<string, string> = {}, options: Partial<DashboardOptions> = {}): Promise<string> {
  const res = await dashboard(`${base}/?token=${TOKEN}`, { headers }, options);
  expect(res.status).toBe(303);
  return res.headers.get('set-cookie')!;
}

const cookieOf = (setCookie: string) => setCookie.split(';')[0]!;
const statusWith = async (cookie: string, options: Partial<DashboardOptions> = {}) =>
  (await dashboard('http://app.test/dashboard/', { headers: { cookie } }, options)).status;

async function hmacHex(key: string, message: string): Promise<string> {
  const k = await crypto.subtle.importKey('raw', new TextEncoder().encode(key), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  return Buffer.from(await crypto.subtle.sign('HMAC', k, new TextEncoder().encode(message))).toString('hex');
}

describe('the session cookie', () => {
  it('is new at each login, and works until it expires', async () => {
    const [a, b] = [await login(), await login()];
    expect(cookieOf(a)).not.toBe(cookieOf(b));
    expect(a).toMatch(/^outlive_dashboard=\d+\.[0-9a-f]{32}\.[0-9a-f]{64}; Path=\/dashboard; HttpOnly; SameSite=Strict; Max-Age=43200$/);
    expect(await statusWith(cookieOf(a))).toBe(200);
    expect(await statusWith(cookieOf(b))).toBe(200);
    expect(await login(undefined, {}, { sessionSeconds: 600 })).toContain('; Max-Age=600');
  });

  it('cannot be computed offline from the token, nor outlive its age on the server', async () => {
    // What the cookie once was: an HMAC of the token alone, valid forever.
    expect(await statusWith(`outlive_dashboard=${await hmacHex(TOKEN, 'outlive-dashboard-session')}`)).toBe(401);
    const hours = (h: number) => Date.now() - h * 3_600_000;
    expect(await statusWith(`outlive_dashboard=${await sessionValue(TOKEN, hours(11))}`)).toBe(200);
    expect(await statusWith(`outlive_dashboard=${await sessionValue(TOKEN, hours(13))}`)).toBe(401);
    expect(await statusWith(`outlive_dashboard=${await sessionValue(TOKEN, hours(1))}`, { sessionSeconds: 1800 })).toBe(401);
    // Issued in the future (a clock set ahead to make it last): refused.
    expect(await statusWith(`outlive_dashboard=${await sessionValue(TOKEN, hours(-1))}`)).toBe(401);
    // An old session made young again: its MAC no longer matches.
    const [issued, nonce, mac] = (await sessionValue(TOKEN, hours(13))).split('.');
    expect(await statusWith(`outlive_dashboard=${Math.floor(Date.now() / 1000)}.${nonce}.${mac}`)).toBe(401);
    expect(issued).toMatch(/^\d+$/);
    // Another token's session.
    expect(await statusWith(`outlive_dashboard=${await sessionValue('another-token-0123456789')}`)).toBe(401);
  });

  it('is Secure over TLS, and behind a proxy that says the browser came over https', async () => {
    expect(await login('https://app.test/dashboard')).toMatch(/; Secure$/);
    expect(await login('http://app.test/dashboard', { 'x-forwarded-proto': 'https' })).toMatch(/; Secure$/);
    expect(await login('http://app.test/dashboard', { 'x-forwarded-proto': 'https, http' })).toMatch(/; Secure$/);
    expect(await login('http://app.test/dashboard')).not.toContain('Secure');
    expect(await login('http://app.test/dashboard', { 'x-forwarded-proto': 'http' })).not.toContain('Secure');
  });

  it('acts on a browser\'s POST only with the page\'s CSRF value, from its own origin', async () => {
    const t = await enqueue(db.pool, explode, { why: 'csrf' });
    await tick(db.pool, { tasks });
    const cookie = cookieOf(await login());
    const post = async (origin: string, csrf: string | null) =>
      dashboard(`http://app.test/dashboard/tasks/${t.id}/retry`, {
        method: 'POST',
        headers: { cookie, origin, 'content-type': 'application/x-www-form-urlencoded' },
        body: csrf === null ? '' : new URLSearchParams({ csrf }).toString(),
      });
    expect((await post('http://app.test', null)).status).toBe(403);
    expect((await post('http://evil.test', await csrfValue(TOKEN))).status).toBe(403);
    const ok = await post('http://app.test', await csrfValue(TOKEN));
    expect(ok.status).toBe(303);
    expect(ok.headers.get('location')).toBe(`/dashboard/tasks/${t.id}?flash=task-retried`);
  });
});

describe('ids beyond a bigint', () => {
  it('answer 404 on every page and action, not 500', async () => {
    await startRun(db.pool, 'a run', { a: step(greet, { name: 'a' }) });
    const bearer = { authorization: `Bearer ${TOKEN}` };
    for (const [method, path] of [
      ['GET', `/runs/${BEYOND_BIGINT}`],
      ['GET', `/tasks/${BEYOND_BIGINT}`],
      ['GET', '/runs/9223372036854775808'],
      ['POST', `/tasks/${BEYOND_BIGINT}/retry`],
      ['POST', `/runs/${BEYOND_BIGINT}/retry`],
      ['POST', `/runs/${BEYOND_BIGINT}/cancel`],
    ] as const) {
      const res = await dashboard(`http://app.test/dashboard${path}`, { method, headers: bearer, ...(method === 'POST' ? { body: '' } : {}) });
      expect({ path, method, status: res.status }).toEqual({ path, method, status: 404 });
    }
  });


  it('are not found by the admin functions either, and text that is no id is refused by name', async () => {
    expect(await getTask(db.pool, BEYOND_BIGINT)).toBeNull();
    expect(await explainRun(db.pool, BEYOND_BIGINT)).toBeNull();
    expect(await runEdges(db.pool, BEYOND_BIGINT)).toEqual([]);
    expect(await retryTask(db.pool, BEYOND_BIGINT)).toMatchObject({ retried: false, state: null });
    expect(await retryRun(db.pool, BEYOND_BIGINT)).toMatchObject({ retried: false, state: null });
    expect(await cancelRun(db.pool, '0')).toMatchObject({ cancelled: false, state: null });
    await expect(getTask(db.pool, '12; DROP TABLE x')).rejects.toThrow(/a task id is a positive whole number, got "12; DROP TABLE x"/);
    await expect(explainRun(db.pool, '-1')).rejects.toThrow(/a run id is a positive whole number/);
  });
});

describe('redirects', () => {
  it('stay on the dashboard\'s host when basePath is empty, whatever the path', async () => {
    for (const path of ['//evil.example', '//evil.example/x', '/\\evil.example', '///evil.example']) {
      const res = await dashboard(`http://app.test${path}?token=${TOKEN}`, {}, { basePath: '' });
      expect(res.status).toBe(303);
      const location = res.headers.get('location')!;
      expect({ path, location }).toEqual({ path, location: expect.stringMatching(/^\/[^/\\]/) });
      expect(new URL(location, 'http://app.test/').host).toBe('app.test');
    }
    const t = await enqueue(db.pool, explode, { why: 'redirect' });
    await tick(db.pool, { tasks });
    const retried = await dashboard(`http://app.test/tasks/${t.id}/retry`, { method: 'POST', headers: { authorization: `Bearer ${TOKEN}` }, body: '' }, { basePath: '' });
    expect(retried.headers.get('location')).toBe(`/tasks/${t.id}?flash=task-retried`);
  });
});
