/**
 * Serves a Web handler (`Request` in, `Response` out) on node:http, so the
 * dashboard's handler runs locally and in tests exactly as a function runs it.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A running server. */
export interface LocalServer {
  /** `http://127.0.0.1:PORT`. */
  url: string;
  server: Server;
  close(): Promise<void>;
}

async function toRequest(req: IncomingMessage, base: string): Promise<Request> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (Array.isArray(value)) for (const v of value) headers.append(name, v);
    else if (value !== undefined) headers.set(name, value);
  }
  const body = req.method === 'GET' || req.method === 'HEAD' ? undefined : Buffer.concat(chunks);
  return new Request(new URL(req.url ?? '/', base), { method: req.method, headers, body });
}

/** Serves `handler` on 127.0.0.1 (`port` 0: any free port). A handler that throws answers 500. */
export async function serveHandler(handler: (request: Request) => Promise<Response>, port = 0): Promise<LocalServer> {
  let base = '';
  const server = createServer((req, res) => {
    void (async () => {
      try {
        const response = await handler(await toRequest(req, base));
        const headers: Record<string, string | string[]> = {};
        response.headers.forEach((value, name) => {
          headers[name] = name === 'set-cookie' ? response.headers.getSetCookie() : value;
        });
        res.writeHead(response.status, headers);
        res.end(Buffer.from(await response.arrayBuffer()));
      } catch (err) {
        console.error(`outlive: local server: ${err instanceof Error ? err.message : String(err)}`);
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
        res.end('internal error');
      }
    })();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: base,
    server,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
