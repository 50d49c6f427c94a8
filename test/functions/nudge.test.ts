/**
 * Signing and verifying nudges: the HMAC over method, endpoint, timestamp,
 * nonce and body bytes, the freshness window, and single use of nonces in
 * the real database.
 */
import { describe, expect, it } from 'vitest';
import {
  canonicalEndpoint,
  DEFAULT_TOLERANCE_MS,
  parseEndpoints,
  secretsEqual,
  signNudge,
  useNonce,
  verifyNudge,
  verifySignature,
  type SignedRequest,
} from '../../src/http/nudge.js';
import { freshDb } from '../support/db.js';

const db = await freshDb();
const exec = db.pool;
const SECRET = 's'.repeat(16) + crypto.randomUUID();
const now = new Date('2026-03-01T12:00:00Z');
const URL_ = 'https://jobs.example.com/drain';
const utf8 = (text: string) => new TextEncoder().encode(text);
/** The request a signature for `URL_` is checked against, with its body as UTF-8 bytes. */
const at = (body: string | Uint8Array, endpoints: string[] = [URL_], method = 'POST'): SignedRequest => ({
  method,
  endpoints,
  body: typeof body === 'string' ? utf8(body) : body,
});

describe('signatures', () => {
  it('verify for the same secret, endpoint and body, within the window', async () => {
    const header = await signNudge(SECRET, URL_, '{"a":1}', { now, nonce: 'n'.repeat(22) });
    expect(header).toMatch(/^t=\d+,n=n{22},e=https%3A%2F%2Fjobs\.example\.com%2Fdrain,v2=[A-Za-z0-9_-]{43}$/);
    expect(await verifySignature(SECRET, header, at('{"a":1}'), { now })).toEqual({
      ok: true,
      timestamp: now,
      nonce: 'n'.repeat(22),
      endpoint: URL_,
    });
    const edge = new Date(now.getTime() + DEFAULT_TOLERANCE_MS);
    expect(await verifySignature(SECRET, header, at('{"a":1}'), { now: edge })).toMatchObject({ ok: true });
    // A string body is signed as its UTF-8 bytes, which is what is sent.
    expect(await verifySignature(SECRET, await signNudge(SECRET, URL_, utf8('é'), { now }), at('é'), { now })).toMatchObject({ ok: true });
  });

  it('fail for a missing, malformed or wrong signature, a changed body, endpoint or method, or another secret', async () => {
    const header = await signNudge(SECRET, URL_, 'body', { now });
    const cases: [string | null, SignedRequest, string, string][] = [
      [null, at('body'), SECRET, 'missing'],
      ['', at('body'), SECRET, 'missing'],
      ['v2=abc', at('body'), SECRET, 'malformed'],
      [header.replace(/t=\d+/, 't=12x'), at('body'), SECRET, 'malformed'],
      [header + ',t=1', at('body'), SECRET, 'malformed'],
      [header.replace(/v2=[\w-]/, 'v2=*'), at('body'), SECRET, 'malformed'],
      [header.replace(/,e=[^,]+/, ''), at('body'), SECRET, 'malformed'],
      [header.replace(/e=[^,]+/, 'e=%E0%A4%A'), at('body'), SECRET, 'malformed'],
      // A newline in the endpoint could shift the signed string's fields.
      [header.replace(/e=[^,]+/, 'e=https%3A%2F%2Fx%0A1'), at('body'), SECRET, 'malformed'],
      [header.replace(/v2=[\w-]+/, 'v2=' + 'A'.repeat(43)), at('body'), SECRET, 'wrong'],
      [header, at('body!'), SECRET, 'wrong'],
      [header, at('body', [URL_], 'PUT'), SECRET, 'wrong'],
      [header.replace(/t=(\d+)/, (_, t) => `t=${Number(t) + 1}`), at('body'), SECRET, 'wrong'],
      [header.replace(/n=([\w-]+)/, 'n=' + 'x'.repeat(22)), at('body'), SECRET, 'wrong'],
      // The endpoint is signed: rewriting it to this verifier's endpoint breaks the MAC.
      [header.replace(/e=[^,]+/, 'e=' + encodeURIComponent('https://other.example.com/drain')), at('body', ['https://other.example.com/drain']), SECRET, 'wrong'],
      [header, at('body'), SECRET + 'x', 'wrong'],
    ];
    for (const [h, request, secret, reason] of cases) {
      expect({ h, result: await verifySignature(secret, h, request, { now }) }).toEqual({ h, result: { ok: false, reason } });
    }
  });

  it('cover the body\'s bytes, not the string they decode to', async () => {
    const header = await signNudge(SECRET, URL_, '{"a":"\uFFFD"}', { now });
    expect(await verifySignature(SECRET, header, at('{"a":"\uFFFD"}'), { now })).toMatchObject({ ok: true });
    // An invalid byte (decoded as U+FFFD), or a byte order mark (dropped when decoded): other bodies.
    const invalid = new Uint8Array([...utf8('{"a":"'), 0xff, ...utf8('"}')]);
    const withBom = new Uint8Array([0xef, 0xbb, 0xbf, ...utf8('{"a":"\uFFFD"}')]);
    for (const body of [invalid, withBom]) {
      expect(new TextDecoder().decode(body)).toBe('{"a":"\uFFFD"}');
      expect(await verifySignature(SECRET, header, at(body), { now })).toEqual({ ok: false, reason: 'wrong' });
    }
  });

  it('are misdirected when signed for an endpoint the verifier does not answer as', async () => {
    const header = await signNudge(SECRET, 'https://preview.example.com/drain', '', { now });
    expect(await verifySignature(SECRET, header, at(''), { now })).toEqual({
      ok: false,
      reason: 'misdirected',
      endpoint: 'https://preview.example.com/drain',
    });
    expect(await verifySignature(SECRET, header, at('', [URL_, 'https://PREVIEW.example.com:443/drain/']), { now })).toMatchObject({
      ok: true,
      endpoint: 'https://preview.example.com/drain',
    });
    const byId = await signNudge(SECRET, 'prod-eu', '', { now });
    expect(await verifySignature(SECRET, byId, at('', ['prod-eu']), { now })).toMatchObject({ ok: true, endpoint: 'prod-eu' });
    expect(await verifySignature(SECRET, byId, at('', ['prod-us', URL_]), { now })).toMatchObject({ ok: false, reason: 'misdirected' });
    // Told only to the secret's holder: a wrong MAC says "wrong" whatever the endpoint.
    expect(await verifySignature(SECRET + 'x', header, at(''), { now })).toEqual({ ok: false, reason: 'wrong' });
  });

  it('refuse the v1 format as outdated, without verifying it', async () => {
    const v1 = `t=${now.getTime()},n=${'n'.repeat(22)},v1=${'A'.repeat(43)}`;
    expect(await verifySignature(SECRET, v1, at(''), { now })).toEqual({ ok: false, reason: 'outdated' });
    expect(await verifySignature(SECRET, 'v1=abc', at(''), { now })).toEqual({ ok: false, reason: 'malformed' });
  });

  it('fail when stale or from the future, checked after the MAC', async () => {
    const header = await signNudge(SECRET, URL_, '', { now });
    const late = new Date(now.getTime() + DEFAULT_TOLERANCE_MS + 1);
    const early = new Date(now.getTime() - DEFAULT_TOLERANCE_MS - 1);
    expect(await verifySignature(SECRET, header, at(''), { now: late })).toMatchObject({ ok: false, reason: 'stale' });
    expect(await verifySignature(SECRET, header, at(''), { now: early })).toMatchObject({ ok: false, reason: 'stale' });
    expect(await verifySignature(SECRET, header, at(''), { now: late, toleranceMs: 10 * 60_000 })).toMatchObject({ ok: true });
    // A stale timestamp with a wrong MAC says "wrong": clocks are told only to the secret's holder.
    expect(await verifySignature(SECRET + 'x', header, at(''), { now: late })).toEqual({ ok: false, reason: 'wrong' });
  });

  it('refuse a short secret, naming the fix', async () => {
    await expect(signNudge('short', URL_, '')).rejects.toThrow(/OUTLIVE_DRAIN_SECRET must be a secret of at least 32 characters/);
    await expect(verifySignature('short', 't=1', at(''))).rejects.toThrow(/openssl rand -hex 32/);
  });

  it('compare bearer secrets whatever their lengths', () => {
    expect(secretsEqual('abc', 'abc')).toBe(true);
    expect(secretsEqual('', 'abc')).toBe(false);
    expect(secretsEqual('ab', 'abc')).toBe(false);
    expect(secretsEqual('abcd', 'abc')).toBe(false);
    expect(secretsEqual('abd', 'abc')).toBe(false);
  });
});

describe('endpoints', () => {
  it('are canonical URLs without query, default port or trailing slash, or ids', () => {
    const same: [string, string][] = [
      ['https://jobs.example.com/drain', 'https://jobs.example.com/drain'],
      [' HTTPS://Jobs.Example.COM:443/drain/ ', 'https://jobs.example.com/drain'],
      ['https://jobs.example.com/api/../drain?x=1#y', 'https://jobs.example.com/drain'],
      ['https://user:pw@jobs.example.com/drain', 'https://jobs.example.com/drain'],
      ['http://127.0.0.1:8787/drain', 'http://127.0.0.1:8787/drain'],
      ['http://jobs.example.com:80', 'http://jobs.example.com/'],
      ['https://jobs.example.com//', 'https://jobs.example.com/'],
      ['https://bücher.example/drain', 'https://xn--bcher-kva.example/drain'],
      ['production-eu_1', 'production-eu_1'],
    ];
    for (const [input, canonical] of same) expect({ input, out: canonicalEndpoint(input) }).toEqual({ input, out: canonical });
    for (const bad of ['', 'jobs.example.com/drain', 'ftp://jobs.example.com/drain', '/drain', 'a b', 'x'.repeat(129)]) {
      expect(() => canonicalEndpoint(bad), bad).toThrow(/absolute http\(s\) URL.*or an endpoint id/);
    }
  });

  it('are listed comma-separated, and a bad list names the setting, never its value', () => {
    expect(parseEndpoints('https://a.example/drain/, https://b.example/drain ,prod')).toEqual([
      'https://a.example/drain',
      'https://b.example/drain',
      'prod',
    ]);
    expect(() => parseEndpoints(' , ')).toThrow(/OUTLIVE_DRAIN_URL must list at least one/);
    expect(() => parseEndpoints('https://a.example/drain,secret.example/x')).toThrow(/each entry of OUTLIVE_DRAIN_URL/);
    expect(() => parseEndpoints('https://a.example/drain,secret.example/x')).not.toThrow(/secret\.example/);
  });
});

describe('nonces', () => {
  it('are accepted once: a replay, even a concurrent one, is refused', async () => {
    const nonce = 'race' + crypto.randomUUID().replace(/-/g, '');
    const results = await Promise.all(Array.from({ length: 10 }, () => useNonce(exec, nonce, now, { now })));
    expect(results.filter(Boolean)).toHaveLength(1);
    expect(await useNonce(exec, nonce, now, { now })).toBe(false);
  });

  it('are forgotten once their timestamp is stale for every verifier, and not before', async () => {
    const nonce = 'old' + crypto.randomUUID().replace(/-/g, '');
    expect(await useNonce(exec, nonce, now, { now })).toBe(true);
    const keep = new Date(now.getTime() + 2 * DEFAULT_TOLERANCE_MS - 1);
    await useNonce(exec, 'other' + crypto.randomUUID().replace(/-/g, ''), keep, { now: keep });
    expect(await db.rows(`SELECT 1 FROM outlive.used_nonces WHERE nonce = $1`, [nonce])).toHaveLength(1);
    const later = new Date(now.getTime() + 2 * DEFAULT_TOLERANCE_MS + 1);
    await useNonce(exec, 'prune' + crypto.randomUUID().replace(/-/g, ''), later, { now: later });
    expect(await db.rows(`SELECT 1 FROM outlive.used_nonces WHERE nonce = $1`, [nonce])).toHaveLength(0);
    // Forgotten, but the timestamp alone now refuses it.
    const header = await signNudge(SECRET, URL_, '', { now, nonce });
    expect(await verifySignature(SECRET, header, at(''), { now: later })).toMatchObject({ ok: false, reason: 'stale' });
  });

  it('are spent only by a valid signature for this endpoint', async () => {
    const nonce = 'spent' + crypto.randomUUID().replace(/-/g, '');
    const forged = await signNudge('f'.repeat(40), URL_, '', { now, nonce });
    expect(await verifyNudge(exec, SECRET, forged, at(''), { now })).toEqual({ ok: false, reason: 'wrong' });
    const stale = await signNudge(SECRET, URL_, '', { now: new Date(now.getTime() - DEFAULT_TOLERANCE_MS - 1), nonce });
    expect(await verifyNudge(exec, SECRET, stale, at(''), { now })).toMatchObject({ ok: false, reason: 'stale' });
    const elsewhere = await signNudge(SECRET, 'https://preview.example.com/drain', '', { now, nonce });
    expect(await verifyNudge(exec, SECRET, elsewhere, at(''), { now })).toMatchObject({ ok: false, reason: 'misdirected' });
    const real = await signNudge(SECRET, URL_, '', { now, nonce });
    expect(await verifyNudge(exec, SECRET, real, at(''), { now })).toMatchObject({ ok: true, nonce });
    expect(await verifyNudge(exec, SECRET, real, at(''), { now })).toMatchObject({ ok: false, reason: 'replayed' });
  });
});
