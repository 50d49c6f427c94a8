/**
 * Signing and verifying nudges: the HMAC over timestamp, nonce and body, the
 * freshness window, and single use of nonces in the real database.
 */
import { describe, expect, it } from 'vitest';
import { toExecutor } from '../../src/db/executor.js';
import {
  DEFAULT_TOLERANCE_MS,
  secretsEqual,
  signNudge,
  useNonce,
  verifyNudge,
  verifySignature,
} from '../../src/http/nudge.js';
import { freshDb } from '../support/db.js';

const db = await freshDb();
const exec = toExecutor(db.pool);
const SECRET = 's'.repeat(16) + crypto.randomUUID();
const now = new Date('2026-03-01T12:00:00Z');

describe('signatures', () => {
  it('verify for the same secret and body, within the window', async () => {
    const header = await signNudge(SECRET, '{"a":1}', { now, nonce: 'n'.repeat(22) });
    expect(header).toMatch(/^t=\d+,n=n{22},v1=[A-Za-z0-9_-]{43}$/);
    expect(await verifySignature(SECRET, header, '{"a":1}', { now })).toEqual({ ok: true, timestamp: now, nonce: 'n'.repeat(22) });
    const edge = new Date(now.getTime() + DEFAULT_TOLERANCE_MS);
    expect(await verifySignature(SECRET, header, '{"a":1}', { now: edge })).toMatchObject({ ok: true });
  });

  it('fail for a missing, malformed or wrong signature, a changed body, or another secret', async () => {
    const header = await signNudge(SECRET, 'body', { now });
    const cases: [string | null, string, string, string][] = [
      [null, 'body', SECRET, 'missing'],
      ['', 'body', SECRET, 'missing'],
      ['v1=abc', 'body', SECRET, 'malformed'],
      [header.replace(/t=\d+/, 't=12x'), 'body', SECRET, 'malformed'],
      [header + ',t=1', 'body', SECRET, 'malformed'],
      [header.replace(/v1=[\w-]/, 'v1=*'), 'body', SECRET, 'malformed'],
      [header.replace(/v1=[\w-]+/, 'v1=' + 'A'.repeat(43)), 'body', SECRET, 'wrong'],
      [header, 'body!', SECRET, 'wrong'],
      [header.replace(/t=(\d+)/, (_, t) => `t=${Number(t) + 1}`), 'body', SECRET, 'wrong'],
      [header.replace(/n=([\w-]+)/, 'n=' + 'x'.repeat(22)), 'body', SECRET, 'wrong'],
      [header, 'body', SECRET + 'x', 'wrong'],
    ];
    for (const [h, body, secret, reason] of cases) {
      expect({ h, result: await verifySignature(secret, h, body, { now }) }).toEqual({ h, result: { ok: false, reason } });
    }
  });

  it('fail when stale or from the future, checked after the MAC', async () => {
    const header = await signNudge(SECRET, '', { now });
    const late = new Date(now.getTime() + DEFAULT_TOLERANCE_MS + 1);
    const early = new Date(now.getTime() - DEFAULT_TOLERANCE_MS - 1);
    expect(await verifySignature(SECRET, header, '', { now: late })).toEqual({ ok: false, reason: 'stale' });
    expect(await verifySignature(SECRET, header, '', { now: early })).toEqual({ ok: false, reason: 'stale' });
    expect(await verifySignature(SECRET, header, '', { now: late, toleranceMs: 10 * 60_000 })).toMatchObject({ ok: true });
    // A stale timestamp with a wrong MAC says "wrong": clocks are told only to the secret's holder.
    expect(await verifySignature(SECRET + 'x', header, '', { now: late })).toEqual({ ok: false, reason: 'wrong' });
  });

  it('refuse a short secret, naming the fix', async () => {
    await expect(signNudge('short', '')).rejects.toThrow(/OUTLIVE_DRAIN_SECRET must be a secret of at least 32 characters/);
    await expect(verifySignature('short', 't=1', '')).rejects.toThrow(/openssl rand -hex 32/);
  });

  it('compare bearer secrets whatever their lengths', () => {
    expect(secretsEqual('abc', 'abc')).toBe(true);
    expect(secretsEqual('', 'abc')).toBe(false);
    expect(secretsEqual('ab', 'abc')).toBe(false);
    expect(secretsEqual('abcd', 'abc')).toBe(false);
    expect(secretsEqual('abd', 'abc')).toBe(false);
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
    const header = await signNudge(SECRET, '', { now, nonce });
    expect(await verifySignature(SECRET, header, '', { now: later })).toEqual({ ok: false, reason: 'stale' });
  });

  it('are spent only by a valid signature', async () => {
    const nonce = 'spent' + crypto.randomUUID().replace(/-/g, '');
    const forged = (await signNudge('f'.repeat(40), '', { now, nonce }));
    expect(await verifyNudge(exec, SECRET, forged, '', { now })).toEqual({ ok: false, reason: 'wrong' });
    const stale = await signNudge(SECRET, '', { now: new Date(now.getTime() - DEFAULT_TOLERANCE_MS - 1), nonce });
    expect(await verifyNudge(exec, SECRET, stale, '', { now })).toEqual({ ok: false, reason: 'stale' });
    const real = await signNudge(SECRET, '', { now, nonce });
    expect(await verifyNudge(exec, SECRET, real, '', { now })).toMatchObject({ ok: true, nonce });
    expect(await verifyNudge(exec, SECRET, real, '', { now })).toEqual({ ok: false, reason: 'replayed' });
  });
});
