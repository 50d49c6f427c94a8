/**
 * A stand-in for a model provider's background responses, on its real rules:
 * `POST /v1/responses` with `background: true` answers at once with a
 * `queued` response (a start sent twice is two responses: nothing is
 * deduplicated); `GET /v1/responses/:id` reads it; when it ends, the
 * provider sends a thin `response.completed` event (`data.id` only) signed
 * as Standard Webhooks (`webhook-id` stable across redeliveries, unix-second
 * `webhook-timestamp`, `v1,<base64 HMAC-SHA256 of id.timestamp.body>` under
 * the `whsec_` secret's decoded key), retrying a delivery that did not get a
 * 2xx. Each start takes the next plan: when it finishes, how many times its
 * webhook is delivered, and whether the webhook beats the start's reply.
 */
import { createHmac, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What happens to one background response. */
export interface ResponsePlan {
  /** When it ends, in ms after its start; null: never. */
  finishAfterMs: number | null;
  /** Deliveries of its webhook (a provider redelivers with the same webhook-id). */
  deliveries: number;
  /** Deliver the webhook before answering the start (a provider faster than the app's commit). */
  beforeReply?: boolean;
}

interface Response {
  id: string;
  status: 'queued' | 'completed';
  created_at: number;
  input: string;
  output?: { content: { type: 'output_text'; text: string }[] }[];
}

export interface ModelProviderStub {
  url: string;
  apiKey: string;
  /** The webhook secret, `whsec_<base64>`. */
  secret: string;
  responses: Map<string, Response>;
  /** Status codes the webhook deliveries got, in order. */
  deliveries: number[];
  starts: number;
  plan(plan: ResponsePlan): void;
  close(): Promise<void>;
}

/** Starts the provider, sending webhooks to `webhookUrl` (set later with `setWebhookUrl` when the receiver starts after). */
export async function startModelProvider(): Promise<ModelProviderStub & { setWebhookUrl(url: string): void }> {
  const apiKey = `sk-test-${randomBytes(8).toString('hex')}`;
  const key = randomBytes(24);
  const secret = `whsec_${key.toString('base64')}`;
  const responses = new Map<string, Response>();
  const plans: ResponsePlan[] = [];
  const deliveries: number[] = [];
  const timers = new Set<NodeJS.Timeout>();
  let webhookUrl = '';
  let n = 0;
  let starts = 0;

  const later = (ms: number, fn: () => void) => {
    const t = setTimeout(() => {
      timers.delete(t);
      fn();
    }, ms);
    timers.add(t);
  };

  async function deliver(event: object, eventId: string, times: number): Promise<void> {
    const body = JSON.stringify(event);
    for (let i = 0; i < times; i++) {
      const timestamp = Math.floor(Date.now() / 1000).toString();
      const signature = createHmac('sha256', key).update(`${eventId}.${timestamp}.${body}`).digest('base64');
      const res = await fetch(webhookUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'webhook-id': eventId, 'webhook-timestamp': timestamp, 'webhook-signature': `v1,${signature}` },
        body,
      });
      await res.arrayBuffer();
      deliveries.push(res.status);
    }
  }

  async function finish(r: Response, plan: ResponsePlan): Promise<void> {
    r.status = 'completed';
    r.output = [{ content: [{ type: 'output_text', text: `<h1>${r.input}</h1>` }] }];
    const eventId = `evt_${randomBytes(8).toString('hex')}`;
    await deliver({ id: eventId, object: 'event', created_at: Math.floor(Date.now() / 1000), type: 'response.completed', data: { id: r.id } }, eventId, plan.deliveries);
  }

  const read = (req: IncomingMessage) =>
    new Promise<string>((resolve) => {
      let text = '';
      req.on('data', (c) => (text += c));
      req.on('end', () => resolve(text));
    });

  const server = createServer(async (req, res) => {
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.headers.authorization !== `Bearer ${apiKey}`) return send(401, { error: { message: 'Incorrect API key provided' } });
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (req.method === 'POST' && path === '/v1/responses') {
      const body = JSON.parse(await read(req)) as { input?: string; background?: boolean };
      if (body.background !== true) return send(400, { error: { message: 'this stand-in serves background responses only' } });
      starts++;
      const plan = plans.shift() ?? { finishAfterMs: 50, deliveries: 1 };
      const r: Response = { id: `resp_${++n}`, status: 'queued', created_at: Math.floor(Date.now() / 1000), input: String(body.input ?? '') };
      responses.set(r.id, r);
      if (plan.beforeReply && plan.finishAfterMs !== null) await finish(r, plan);
      else if (plan.finishAfterMs !== null) later(plan.finishAfterMs, () => void finish(r, plan).catch(() => undefined));
      return send(200, { id: r.id, object: 'response', status: 'queued', created_at: r.created_at, background: true });
    }
    const m = /^\/v1\/responses\/([^/]+)$/.exec(path);
    if (req.method === 'GET' && m) {
      const r = responses.get(m[1]!);
      return r ? send(200, { object: 'response', ...r }) : send(404, { error: { message: `No response found with id '${m[1]}'` } });
    }
    send(404, { error: { message: 'not found' } });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    apiKey,
    secret,
    responses,
    deliveries,
    get starts() {
      return starts;
    },
    plan: (p) => void plans.push(p),
    setWebhookUrl: (u) => void (webhookUrl = u),
    close: async () => {
      for (const t of timers) clearTimeout(t);
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
