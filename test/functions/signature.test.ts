/**
 * What the drain's signature covers, end to end through `handleDrain`: the
 * endpoint the nudger meant (so a nudge captured for one deployment cannot be
 * replayed on another that shares the secret), the exact body bytes, and the
 * version of the format. Each drain here is a real invocation's handler over
 * its own database; nudges are captured on their way out of `nudge()`.
 */
import { describe, expect, it } from 'vitest';
import { handleDrain } from '../../src/http/drain.js';
import type { FunctionsEnv, Invocation } from '../../src/http/invocation.js';
import { nudge, signNudge, SIGNATURE_HEADER, type NudgeOptions } from '../../src/http/nudge.js';
import { freshDb, type TestDb } from '../support/db.js';

// Two deployments sharing a secret, each with its own database (a preview and production).
const preview = await freshDb();
const production = await freshDb();
const SECRET = 's'.repeat(16) + crypto.randomUUID();
const lines: string[] = [];

/**
 * A drain endpoint: `handleDrain` on an invocation over `db`, with the
 * settings of `env`, on a platform that routes by host (as Workers and Vercel
 * do) unless `routedByHost` is false (a self-hosted server).
 */
function drainOf(db: TestDb, env: FunctionsEnv = {}, routedByHost = true) {
  const inv: Invocation = {
    platform: 'test',
    routedByHost,
    env: { OUTLIVE_DRAIN_SECRET: SECRET, ...env },
    database: { driver: 'pg', connectionString: db.url, from: 'DATABASE_URL' },
    pool: db.pool as unknown as Invocation['pool'],
    tasks: [],
    schedules: [],
    budgetMs: 2_000,
    concurrency: undefined,
    background: null,
    log: (event, fields = {}) => lines.push(JSON.stringify({ outlive: event, ...fields })),
    redact: (text) => text,
    close: async () => undefined,
  };
  return async (request: Request) => {
    const response = await handleDrain(request, inv);
    return { status: response.status, json: (await response.json()) as { error?: string; report?: unknown } };
  };
}

/** A nudge as it leaves `nudge()`: the URL it went to, its headers and its exact body bytes. */
interface Captured {
  url: string;
  headers: Headers;
  body: Uint8Array<ArrayBuffer>;
}

async function capture(url: string, body: string | object = '', options: NudgeOptions = {}): Promise<Captured> {
  let captured: Captured | undefined;
  const result = await nudge(url, SECRET, body, {
    ...options,
    respondAsync: false,
    fetch: async (input, init) => {
      const request = new Request(input as string, init);
      captured = { url: request.url, headers: request.headers, body: new Uint8Array(await request.arrayBuffer()) };
      return new Response(null, { status: 204 });
    },
  });
  expect(result).toMatchObject({ delivered: true });
  return captured!;
}

/** Delivers a captured nudge to a URL (where the platform says it arrived), with its body replaced when given. */
function deliver(to: string, nudged: Captured, body: Uint8Array<ArrayBuffer> = nudged.body): Request {
  return new Request(to, { method: 'POST', headers: nudged.headers, body });
}

const concat = (...parts: (Uint8Array | number[])[]) => new Uint8Array(parts.flatMap((p) => Array.from(p)));
const utf8 = (text: string) => new TextEncoder().encode(text);

/** A nudge in the format outlive signed before v2: HMAC over `<t>.<nonce>.<body>`, sent as `v1=`. */
async function signV1(secret: string, body: string, t = Date.now(), nonce = 'v1nonce' + crypto.randomUUID().replace(/-/g, '')): Promise<string> {
  const key = await crypto.subtle.importKey('raw', utf8(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const mac = new Uint8Array(await crypto.subtle.sign('HMAC', key, utf8(`${t}.${nonce}.${body}`)));
  const b64 = btoa(String.fromCharCode(...mac)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  return `t=${t},n=${nonce},v1=${b64}`;
}

describe('the endpoint', () => {
  const PREVIEW = 'https://outlive-git-feature.vercel.app/api/drain';
  const PRODUCTION = 'https://jobs.example.com/api/drain';

  it('is signed: a nudge for one deployment replayed on another sharing the secret is refused, naming the reason', async () => {
    const captured = await capture(PREVIEW, { queues: ['default'] });
    expect((await drainOf(preview)(deliver(PREVIEW, captured))).status).toBe(200);
    // Production has its own database, so its nonces never saw this one: only the endpoint refuses it.
    const replayed = await drainOf(production)(deliver(PRODUCTION, captured));
    expect(replayed.status).toBe(401);
    expect(replayed.json.error).toMatch(/another endpoint/);
    expect(replayed.json.error).not.toContain(SECRET);
    expect(lines.at(-1)).toContain('"reason":"misdirected"');
  });

  it('is checked before the nonce is spent, on the same database too', async () => {
    const captured = await capture(PREVIEW);
    const refused = await drainOf(preview)(deliver(PRODUCTION, captured));
    expect(refused.status).toBe(401);
    expect(refused.json.error).toMatch(/another endpoint/);
    // The refusal spent nothing: the nudge still works where it was sent.
    expect((await drainOf(preview)(deliver(PREVIEW, captured))).status).toBe(200);
  });

  it('is the request\'s own URL by default, with the scheme, host and path, but not the query', async () => {
    // Case of the host, the default port, a trailing slash and the query do not make another endpoint.
    const variants: [signed: string, arrived: string][] = [
      ['https://Jobs.Example.com:443/api/drain', PRODUCTION],
      ['https://jobs.example.com/api/drain/', PRODUCTION],
      ['https://jobs.example.com/api/drain?from=app', PRODUCTION],
      [PRODUCTION, 'https://jobs.example.com/api/drain?x-vercel-rewrite=1'],
    ];
    for (const [signed, arrived] of variants) {
      const res = await drainOf(production)(deliver(arrived, await capture(signed)));
      expect({ signed, arrived, status: res.status }).toEqual({ signed, arrived, status: 200 });
    }
    // Another scheme, host, port or path does.
    const others: [signed: string, arrived: string][] = [
      ['http://jobs.example.com/api/drain', PRODUCTION],
      ['https://jobs.example.com:8443/api/drain', PRODUCTION],
      ['https://example.com/api/drain', PRODUCTION],
      ['https://jobs.example.com/drain', PRODUCTION],
    ];
    for (const [signed, arrived] of others) {
      const res = await drainOf(production)(deliver(arrived, await capture(signed)));
      expect({ signed, arrived, status: res.status, error: res.json.error }).toEqual({
        signed,
        arrived,
        status: 401,
        error: expect.stringMatching(/another endpoint/),
      });
    }
  });

  it('is never taken from the Host header of a self-hosted drain: it must be set (OUTLIVE_DRAIN_URL)', async () => {
    // Two self-hosted deployments sharing the secret. A nudge captured for
    // production is sent to the preview's server with production's Host:
    // the URL the server builds is production's, but the drain is the preview's.
    const captured = await capture(PRODUCTION);
    const forged = await drainOf(preview, {}, false)(deliver(PRODUCTION, captured));
    expect(forged.status).toBe(500);
    expect(forged.json.error).toBe('the drain endpoint is not configured');
    expect(lines.at(-1)).toContain('set OUTLIVE_DRAIN_URL to the URL the app nudges');
    // Configured, each answers only as itself, whatever Host a request claims.
    const previewDrain = drainOf(preview, { OUTLIVE_DRAIN_URL: PREVIEW }, false);
    const refused = await previewDrain(deliver(PRODUCTION, captured));
    expect({ status: refused.status, error: refused.json.error }).toEqual({ status: 401, error: expect.stringMatching(/another endpoint/) });
    expect((await previewDrain(deliver('http://10.0.0.5:3000/api/drain', await capture(PREVIEW)))).status).toBe(200);
    expect((await drainOf(production, { OUTLIVE_DRAIN_URL: PRODUCTION }, false)(deliver(PRODUCTION, captured))).status).toBe(200);
  });

  it('may be set (OUTLIVE_DRAIN_URL) to the URLs the drain answers as, when a proxy or rewrite changes what it sees', async () => {
    const WORKERS_DEV = 'https://outlive.acct.workers.dev/drain';
    const CUSTOM = 'https://jobs.example.com/drain';
    const drain = drainOf(production, { OUTLIVE_DRAIN_URL: `${CUSTOM}, https://jobs.example.org/drain` });
    // The custom domain in front of workers.dev: signed for the custom domain, seen at workers.dev.
    expect((await drain(deliver(WORKERS_DEV, await capture(CUSTOM)))).status).toBe(200);
    expect((await drain(deliver(WORKERS_DEV, await capture('https://jobs.example.org/drain')))).status).toBe(200);
    // Once set, the list is the whole of it: the request's own URL is not added.
    const direct = await drain(deliver(WORKERS_DEV, await capture(WORKERS_DEV)));
    expect(direct.status).toBe(401);
    expect(direct.json.error).toMatch(/another endpoint.*OUTLIVE_DRAIN_URL/);
  });

  it('may be an endpoint id the nudger is told, instead of a URL', async () => {
    const captured = await capture('https://anything.example/drain', '', { endpoint: 'production-eu' });
    expect((await drainOf(production, { OUTLIVE_DRAIN_URL: 'preview' })(deliver(PRODUCTION, captured))).status).toBe(401);
    expect((await drainOf(production, { OUTLIVE_DRAIN_URL: 'production-eu' })(deliver(PRODUCTION, captured))).status).toBe(200);
  });

  it('answers 500 and runs nothing when OUTLIVE_DRAIN_URL is not a list of URLs or ids', async () => {
    const res = await drainOf(production, { OUTLIVE_DRAIN_URL: 'ftp://jobs.example.com/drain' })(deliver(PRODUCTION, await capture(PRODUCTION)));
    expect(res.status).toBe(500);
    expect(lines.at(-1)).toMatch(/drain-misconfigured.*OUTLIVE_DRAIN_URL/);
  });
});

describe('the body', () => {
  const URL_ = 'https://jobs.example.com/drain';
  const drain = drainOf(production);

  it('is signed as the bytes sent: one byte changed is refused', async () => {
    const captured = await capture(URL_, { queues: ['default'] });
    const changed = captured.body.slice();
    changed[changed.length - 4]! ^= 0x01; // "default" becomes "defaulu"
    const res = await drain(deliver(URL_, captured, changed));
    expect(res.status).toBe(401);
    expect(res.json.error).toMatch(/does not match/);
  });

  it('is verified as bytes: other bytes that decode to the same string are refused', async () => {
    // U+FFFD sent as its UTF-8 (EF BF BD); an invalid byte (FF) decodes to U+FFFD too.
    const captured = await capture(URL_, { queues: ['default'], note: '\uFFFD' });
    const at = captured.body.findIndex((b, i) => b === 0xef && captured.body[i + 1] === 0xbf && captured.body[i + 2] === 0xbd);
    expect(at).toBeGreaterThan(0);
    const invalid = concat(captured.body.subarray(0, at), [0xff], captured.body.subarray(at + 3));
    expect(new TextDecoder().decode(invalid)).toBe(new TextDecoder().decode(captured.body));
    const res = await drain(deliver(URL_, captured, invalid));
    expect(res.status).toBe(401);
    expect(res.json.error).toMatch(/does not match/);
  });

  it('is verified as bytes: a byte order mark added in front is refused', async () => {
    const captured = await capture(URL_, { queues: ['default'] });
    const withBom = concat([0xef, 0xbb, 0xbf], captured.body);
    expect(new TextDecoder().decode(withBom)).toBe(new TextDecoder().decode(captured.body));
    const res = await drain(deliver(URL_, captured, withBom));
    expect(res.status).toBe(401);
    expect(res.json.error).toMatch(/does not match/);
    // The bytes it was signed over still go through.
    expect((await drain(deliver(URL_, captured))).status).toBe(200);
  });

  it('is read as UTF-8 once verified: a signed body that is not UTF-8 is a bad request, not read with U+FFFD', async () => {
    const body = concat(utf8('{"queues":["default"],"note":"'), [0xff], utf8('"}'));
    const signature = await signNudge(SECRET, URL_, body);
    const res = await drain(new Request(URL_, { method: 'POST', headers: { [SIGNATURE_HEADER]: signature }, body }));
    expect(res).toEqual({ status: 400, json: { error: 'body must be UTF-8' } });
  });
});

describe('the format', () => {
  it('refuses a v1 signature (the app is older than the drain), naming the fix, and spends nothing', async () => {
    const body = '';
    const nonce = 'v1nonce' + crypto.randomUUID().replace(/-/g, '');
    const v1 = await signV1(SECRET, body, Date.now(), nonce);
    const r = new Request('https://jobs.example.com/drain', { method: 'POST', headers: { [SIGNATURE_HEADER]: v1 }, body });
    const res = await drainOf(production)(r);
    expect(res.status).toBe(401);
    expect(res.json.error).toMatch(/v1.*update outlive in the app/);
    expect(await production.rows(`SELECT 1 FROM outlive.used_nonces WHERE nonce = $1`, [nonce])).toHaveLength(0);
  });
});
