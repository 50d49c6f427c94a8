/**
 * The signal endpoint (issue 27): the Standard Webhooks verifier against
 * signatures this file computes itself with node:crypto; the Vercel route on
 * node-postgres against the real PostgreSQL, ending a parked wait, taking a
 * redelivery as a duplicate and writing nothing for a refused call; and the
 * Worker in Miniflare on Neon's driver, answering `POST /signal`.
 */
import { createHmac, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRun, step, tick, waitFor as waitStep } from '../../src/index.js';
import { signNudge, SIGNATURE_HEADER } from '../../src/http/nudge.js';
import { MAX_SIGNAL_BODY_BYTES, parseSignalSecrets, verifyStandardWebhook } from '../../src/http/signal-route.js';
import { createSignalRoute } from '../../src/http/vercel.js';
import type { FunctionsEnv } from '../../src/http/invocation.js';
import { freshDb } from '../support/db.js';
import { definitions, tasks } from '../support/function-tasks.js';
import { roleUrl, waitFor } from '../support/functions-db.js';
import { createEffects } from '../support/tasks.js';
import { bundleWorker, startWorker, workerDatabase, type RunningWorker, type WorkerDatabase } from '../support/worker.js';

/** A provider's signing secret, as providers show it, and its key. */
function providerSecret(): { secret: string; key: Buffer } {
  const key = randomBytes(32);
  return { secret: `whsec_${key.toString('base64')}`, key };
}

/** Signs as a Standard Webhooks sender does, independently of the code under test. */
function signature(key: Buffer | string, id: string, timestamp: number | string, body: string): string {
  return `v1,${createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest('base64')}`;
}

const nowSeconds = () => Math.floor(Date.now() / 1_000);

/** The three headers of a delivery signed with `key` at `timestamp`. */
function webhookHeaders(key: Buffer | string, body: string, options: { id?: string; timestamp?: number; signature?: string } = {}): Record<string, string> {
  const id = options.id ?? `msg_${randomBytes(8).toString('hex')}`;
  const timestamp = options.timestamp ?? nowSeconds();
  return {
    'content-type': 'application/json',
    'webhook-id': id,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': options.signature ?? signature(key, id, timestamp, body),
  };
}

const current = providerSecret();
const previous = providerSecret();

describe('verifyStandardWebhook', () => {
  const body = '{"key":"k","payload":{"n":1}}';
  const verify = (headers: Record<string, string>, b = body, secrets = [current.secret]) => verifyStandardWebhook(secrets, new Headers(headers), b);

  it('passes a delivery signed with the secret, and gives its id', async () => {
    const headers = webhookHeaders(current.key, body, { id: 'msg_1' });
    expect(await verify(headers)).toMatchObject({ ok: true, id: 'msg_1' });
    // As bytes, too: what the route verifies.
    expect(await verifyStandardWebhook([current.secret], new Headers(headers), new TextEncoder().encode(body))).toMatchObject({ ok: true });
  });

  it('refuses a wrong secret and a tampered body', async () => {
    expect(await verify(webhookHeaders(randomBytes(32), body))).toMatchObject({ ok: false, reason: 'wrong' });
    expect(await verify(webhookHeaders(current.key, body), body.replace('1', '2'))).toMatchObject({ ok: false, reason: 'wrong' });
    // The id and the timestamp are signed too.
    const headers = webhookHeaders(current.key, body, { id: 'msg_a' });
    expect(await verify({ ...headers, 'webhook-id': 'msg_b' })).toMatchObject({ ok: false, reason: 'wrong' });
    expect(await verify({ ...headers, 'webhook-timestamp': String(Number(headers['webhook-timestamp']) - 1) })).toMatchObject({ ok: false, reason: 'wrong' });
  });

  it('refuses a timestamp 6 minutes old or 6 minutes ahead, and passes one 4 minutes either way', async () => {
    for (const [offset, ok] of [[-360, false], [360, false], [-240, true], [240, true]] as const) {
      const result = await verify(webhookHeaders(current.key, body, { timestamp: nowSeconds() + offset }));
      expect({ offset, result }).toMatchObject({ offset, result: ok ? { ok: true } : { ok: false, reason: 'stale' } });
    }
  });

  it('passes when any entry of the header matches, skipping v1a entries', async () => {
    const id = 'msg_multi';
    const t = nowSeconds();
    const good = signature(current.key, id, t, body);
    const other = signature(randomBytes(32), id, t, body);
    const v1a = `v1a,${randomBytes(64).toString('base64')}`;
    expect(await verify(webhookHeaders(current.key, body, { id, timestamp: t, signature: `${other} ${good}` }))).toMatchObject({ ok: true });
    expect(await verify(webhookHeaders(current.key, body, { id, timestamp: t, signature: `${v1a} ${good}` }))).toMatchObject({ ok: true });
    // A v1a entry carrying the right HMAC is still not a v1 entry.
    expect(await verify(webhookHeaders(current.key, body, { id, timestamp: t, signature: good.replace('v1,', 'v1a,') }))).toMatchObject({ ok: false, reason: 'wrong' });
    expect(await verify(webhookHeaders(current.key, body, { id, timestamp: t, signature: other }))).toMatchObject({ ok: false, reason: 'wrong' });
  });

  it('passes with any configured secret: a key being rotated, or a raw secret taken as its UTF-8 bytes', async () => {
    expect(await verify(webhookHeaders(previous.key, body), body, [current.secret, previous.secret])).toMatchObject({ ok: true });
    const raw = 'a-raw-secret-of-enough-bytes-1234';
    expect(await verify(webhookHeaders(Buffer.from(raw, 'utf8'), body), body, [current.secret, raw])).toMatchObject({ ok: true });
  });

  it('refuses missing headers and malformed ones', async () => {
    const headers = webhookHeaders(current.key, body);
    for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
      const { [name]: _, ...rest } = headers;
      expect(await verify(rest)).toMatchObject({ ok: false, reason: 'missing' });
    }
    expect(await verify({ ...headers, 'webhook-timestamp': '2026-01-01T00:00:00Z' })).toMatchObject({ ok: false, reason: 'malformed' });
    expect(await verify({ ...headers, 'webhook-signature': 'nocomma' })).toMatchObject({ ok: false, reason: 'malformed' });
    expect(await verify({ ...headers, 'webhook-signature': Array(11).fill(headers['webhook-signature']).join(' ') })).toMatchObject({ ok: false, reason: 'malformed' });
  });

  it('reads a list of secrets, and refuses one that cannot be a key without quoting it', () => {
    expect(parseSignalSecrets(`${current.secret}, ${previous.secret}`)).toEqual([current.secret, previous.secret]);
    expect(parseSignalSecrets(' ')).toEqual([]);
    expect(() => parseSignalSecrets(`${current.secret} whsec_!!notbase64!!`)).toThrow(/entry 2 of OUTLIVE_SIGNAL_SECRETS is not base64/);
    expect(() => parseSignalSecrets('whsec_c2hvcnQ=')).toThrow(/5 bytes/);
    try {
      parseSignalSecrets('whsec_!!notbase64!!');
    } catch (err) {
      expect((err as Error).message).not.toContain('notbase64');
    }
  });
});

// The Vercel route, on node-postgres against its own database.
const db = await freshDb();
await createEffects(db.pool);
const defs = definitions(db.pool);
const DRAIN_SECRET = randomBytes(32).toString('hex');
const SIGNAL_URL = 'https://app.example/api/signal';
const env: FunctionsEnv = {
  DATABASE_URL: db.url,
  OUTLIVE_SIGNAL_SECRETS: `${previous.secret},${current.secret}`,
  OUTLIVE_DRAIN_SECRET: DRAIN_SECRET,
  // Off Vercel (no VERCEL=1) the request's Host is the client's: outlive-signed calls need the endpoint's URL set.
  OUTLIVE_SIGNAL_URL: SIGNAL_URL,
  OUTLIVE_BUDGET_MS: '10000',
};
const lines: string[] = [];
const write = (line: string) => lines.push(line);
const POST = createSignalRoute(tasks, { env, write });
// The Worker signs in with a password (a role made for this file), as a deployment does.
const workerUrl = (await roleUrl(db)).url;

/** Starts a run that waits on `key`, then runs `done`, and parks its wait with a pass. */
async function parkedRun(key: string, n: number) {
  const run = await startRun(db.pool, `waits-${key}`, { w: waitStep(key, { timeoutMs: 600_000 }), done: step(defs.record, { n }, { after: ['w'] }) });
  // 10 s: a wait is claimed only when its begin's 5 s timeout fits in what is left of the budget.
  expect(await tick(db.pool, { tasks: Object.values(defs), budgetMs: 10_000 })).toMatchObject({ parked: 1 });
  return run;
}

async function stepOf(runId: string, name: string) {
  const [row] = await db.rows<{ state: string; output: unknown; xmin: string }>(
    'SELECT state::text, output, xmin::text AS xmin FROM outlive.tasks WHERE run_id = $1 AND step = $2',
    [runId, name],
  );
  return row!;
}

const signalsOf = async (key: string) => (await db.rows<{ n: number }>('SELECT count(*)::int AS n FROM outlive.signals WHERE key = $1', [key]))[0]!.n;

async function call(route: (r: Request) => Promise<Response>, body: string, headers: Record<string, string>, method = 'POST') {
  const response = await route(new Request(SIGNAL_URL, { method, headers, ...(method === 'POST' ? { body } : {}) }));
  return { status: response.status, headers: response.headers, json: (await response.json()) as any };
}

describe('the Vercel signal route (POST, node-postgres)', () => {
  it('delivers a signed call to a parked wait and runs the pass before answering; a redelivery changes nothing', async () => {
    const run = await parkedRun('k-vercel', 1);
    const body = JSON.stringify({ key: 'k-vercel', payload: { verified: true } });
    const headers = webhookHeaders(current.key, body, { id: 'msg_vercel_1' });
    const res = await call(POST, body, headers);
    expect(res.status).toBe(200);
    // The signal settled the wait in its own transaction; the pass ran the step after it.
    expect(res.json).toMatchObject({ delivered: 1, duplicate: false, report: { succeeded: 1 } });
    expect(await stepOf(run.id, 'w')).toMatchObject({ state: 'succeeded', output: { verified: true } });
    expect(await stepOf(run.id, 'done')).toMatchObject({ state: 'succeeded' });
    expect(lines.some((l) => l.includes('"outlive":"pass"') && l.includes('"driver":"pg"'))).toBe(true);

    // The same delivery again, inside the tolerance: acknowledged as a duplicate, nothing written.
    const before = await stepOf(run.id, 'w');
    const again = await call(POST, body, headers);
    expect(again.status).toBe(200);
    expect(again.json).toEqual({ delivered: 0, duplicate: true });
    expect(await signalsOf('k-vercel')).toBe(1);
    expect((await stepOf(run.id, 'w')).xmin).toBe(before.xmin);
  });

  it('refuses a bad, stale or missing signature with 401 and writes no signal', async () => {
    const run = await parkedRun('k-refused', 2);
    const body = JSON.stringify({ key: 'k-refused', payload: 1 });
    const attempts: [string, Record<string, string>, string?][] = [
      ['wrong secret', webhookHeaders(randomBytes(32), body)],
      ['tampered body', webhookHeaders(current.key, body), body.replace('1', '2')],
      ['stale', webhookHeaders(current.key, body, { timestamp: nowSeconds() - 360 })],
      ['future', webhookHeaders(current.key, body, { timestamp: nowSeconds() + 360 })],
      ['unsigned', { 'content-type': 'application/json' }],
      ['outlive, wrong secret', { [SIGNATURE_HEADER]: await signNudge('x'.repeat(64), SIGNAL_URL, body) }],
    ];
    for (const [what, headers, sent] of attempts) {
      const res = await call(POST, sent ?? body, headers);
      expect({ what, status: res.status }).toEqual({ what, status: 401 });
      expect(res.headers.get('www-authenticate')).toBeTruthy();
    }
    expect(await signalsOf('k-refused')).toBe(0);
    expect((await stepOf(run.id, 'w')).state).toBe('pending');
  });

  it('maps a provider event with toSignal: its key ends the wait, an event it ignores writes nothing', async () => {
    const run = await parkedRun('openai:resp_1', 3);
    const openai = createSignalRoute(tasks, {
      env,
      write,
      toSignal: ({ body }) => {
        const event = body as { type: string; data: { id: string } };
        return event.type === 'response.completed' ? { key: `openai:${event.data.id}`, payload: event.data } : null;
      },
    });
    const ignored = JSON.stringify({ type: 'response.created', data: { id: 'resp_1' } });
    expect((await call(openai, ignored, webhookHeaders(current.key, ignored))).json).toEqual({ ignored: true });
    expect(await signalsOf('openai:resp_1')).toBe(0);
    const done = JSON.stringify({ type: 'response.completed', data: { id: 'resp_1', status: 'completed' } });
    const res = await call(openai, done, webhookHeaders(current.key, done));
    expect(res).toMatchObject({ status: 200, json: { delivered: 1, duplicate: false } });
    expect(await stepOf(run.id, 'w')).toMatchObject({ state: 'succeeded', output: { id: 'resp_1', status: 'completed' } });
  });

  it('answers 400 for a verified body that is not JSON or a signal signal() refuses, writing nothing', async () => {
    for (const body of ['not json', JSON.stringify({ key: '', payload: 1 }), JSON.stringify({ key: 'k-400', extra: 1 }), JSON.stringify({ key: 'k-400', payload: '\u0000' })]) {
      const res = await call(POST, body, webhookHeaders(current.key, body));
      expect({ body, status: res.status }).toEqual({ body, status: 400 });
      expect(typeof res.json.error).toBe('string');
    }
    expect(await signalsOf('k-400')).toBe(0);
  });

  it('takes an outlive-signed call, spending its nonce: a replay is 401', async () => {
    const run = await parkedRun('k-outlive', 4);
    const body = JSON.stringify({ key: 'k-outlive', payload: 'yes', id: 'app-1' });
    const headers = { [SIGNATURE_HEADER]: await signNudge(DRAIN_SECRET, SIGNAL_URL, body) };
    expect(await call(POST, body, headers)).toMatchObject({ status: 200, json: { delivered: 1, duplicate: false } });
    expect(await stepOf(run.id, 'w')).toMatchObject({ state: 'succeeded', output: 'yes' });
    const replay = await call(POST, body, headers);
    expect(replay).toMatchObject({ status: 401, json: { error: 'signature was already used' } });
  });

  it('self-hosted without OUTLIVE_SIGNAL_URL, never takes its endpoint from the Host header: outlive-signed calls are refused, providers\' taken', async () => {
    const { OUTLIVE_SIGNAL_URL: _unset, ...selfHosted } = env;
    const route = createSignalRoute(tasks, { env: selfHosted, write });
    // Signed for another deployment's URL, sent here with that Host: the request URL is the signed one.
    const body = JSON.stringify({ key: 'k-forged', payload: 'no' });
    const forged = await call(route, body, { [SIGNATURE_HEADER]: await signNudge(DRAIN_SECRET, SIGNAL_URL, body) });
    expect(forged).toMatchObject({ status: 401, json: { error: expect.stringMatching(/another endpoint.*self-hosted endpoint must set it/) } });
    const run = await parkedRun('k-provider', 6);
    const fromProvider = JSON.stringify({ key: 'k-provider', payload: 'yes' });
    expect(await call(route, fromProvider, webhookHeaders(current.key, fromProvider))).toMatchObject({ status: 200, json: { delivered: 1 } });
    expect(await stepOf(run.id, 'w')).toMatchObject({ state: 'succeeded', output: 'yes' });
  });

  it('answers at once with waitUntil, the pass handed to it', async () => {
    const run = await parkedRun('k-later', 5);
    const handed: Promise<unknown>[] = [];
    const route = createSignalRoute(tasks, { env, write, waitUntil: (work) => void handed.push(work) });
    const body = JSON.stringify({ key: 'k-later', payload: 5 });
    const res = await call(route, body, webhookHeaders(current.key, body));
    expect(res).toMatchObject({ status: 200, json: { delivered: 1, duplicate: false } });
    expect(res.json.report).toBeUndefined();
    await Promise.all(handed);
    expect(await stepOf(run.id, 'done')).toMatchObject({ state: 'succeeded' });
  });

  it('answers 405, 413, and 500 when no secret is set, logging no secret', async () => {
    expect((await call(POST, '', {}, 'GET')).status).toBe(405);
    const big = JSON.stringify({ key: 'k-big', payload: 'x'.repeat(MAX_SIGNAL_BODY_BYTES) });
    expect((await call(POST, big, webhookHeaders(current.key, big))).status).toBe(413);
    const none = createSignalRoute(tasks, { env: { DATABASE_URL: db.url }, write });
    const body = JSON.stringify({ key: 'k-none' });
    expect(await call(none, body, webhookHeaders(current.key, body))).toMatchObject({ status: 500, json: { error: 'the signal endpoint is not configured' } });
    const bad = 'whsec_!!not-base64-but-secret!!';
    const from = lines.length;
    const broken = createSignalRoute(tasks, { env: { ...env, OUTLIVE_SIGNAL_SECRETS: `${current.secret} ${bad}` }, write });
    expect((await call(broken, body, webhookHeaders(current.key, body))).status).toBe(500);
    const logged = lines.slice(from).join('\n');
    expect(logged).toContain('entry 2 of OUTLIVE_SIGNAL_SECRETS');
    expect(logged).not.toContain('not-base64-but-secret');
    expect(lines.join('\n')).not.toContain(current.secret.slice('whsec_'.length));
    expect(() => createSignalRoute(tasks, { secrets: ['short'] })).toThrow(/under the 16 accepted/);
    expect(await signalsOf('k-none')).toBe(0);
  });
});

describe('the Worker (POST /signal, Neon driver, Miniflare)', () => {
  let database: WorkerDatabase;
  let script: string;
  let worker: RunningWorker | undefined;
  beforeAll(async () => {
    database = await workerDatabase('neon', workerUrl);
    script = await bundleWorker('test/support/function-tasks.ts', database.entry);
  });
  afterAll(async () => {
    await worker?.dispose();
    await database?.close();
  });

  it('verifies a Standard Webhooks call, answers at once, and the wait resumes in waitUntil', async () => {
    worker = await startWorker(script, { ...database.bindings, OUTLIVE_SIGNAL_SECRETS: current.secret, OUTLIVE_BUDGET_MS: '8000' }, database.options);
    const run = await parkedRun('k-worker', 6);
    const body = JSON.stringify({ key: 'k-worker', payload: { from: 'worker' } });
    const w = worker;
    const refused = await w.fetch('/signal', { method: 'POST', headers: webhookHeaders(randomBytes(32), body), body });
    expect(refused.status).toBe(401);
    await refused.arrayBuffer();
    const headers = webhookHeaders(current.key, body, { id: 'msg_worker_1' });
    const res = await w.fetch('/signal/', { method: 'POST', headers, body });
    expect({ status: res.status, json: await res.json() }).toEqual({ status: 200, json: { delivered: 1, duplicate: false } });
    await waitFor(async () => (await stepOf(run.id, 'done')).state === 'succeeded', 20_000, 'the resumed run to finish');
    expect(await stepOf(run.id, 'w')).toMatchObject({ state: 'succeeded', output: { from: 'worker' } });
    // The pass logs once its work in waitUntil is done, which may be after the rows say so.
    await waitFor(async () => /"outlive":"pass".*"driver":"neon"/.test(w.output()), 5_000, 'the pass to log');
    const again = await w.fetch('/signal', { method: 'POST', headers, body });
    expect(await again.json()).toEqual({ delivered: 0, duplicate: true });
  });
});
