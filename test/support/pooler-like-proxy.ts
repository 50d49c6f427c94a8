/**
 * A TCP proxy in front of the test database that does what a transaction
 * pooler does to LISTEN: everything reaches the server and comes back,
 * except the notifications (NotificationResponse, message type 'A'), which
 * a pooler never delivers to the client that LISTENed. Every other message
 * is copied unchanged; it parses only the server's message framing (a type
 * byte and a length) to know where each message ends.
 */
import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net';

/** A running proxy. */
export interface PoolerLikeProxy {
  /** A connection string through the proxy, for the database of `url`. */
  url(url: string): string;
  /** Notifications it kept from a client. */
  readonly dropped: number;
  close(): Promise<void>;
}

/** Starts the proxy towards `host:port`. */
export async function startPoolerLikeProxy(host: string, port: number): Promise<PoolerLikeProxy> {
  let dropped = 0;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = createConnection({ host, port });
    sockets.add(client).add(upstream);
    client.on('close', () => sockets.delete(client));
    upstream.on('close', () => sockets.delete(upstream));
    client.pipe(upstream);
    let pending = Buffer.alloc(0);
    upstream.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      const out: Buffer[] = [];
      while (pending.length >= 5) {
        const length = pending.readInt32BE(1);
        if (pending.length < 1 + length) break;
        const message = pending.subarray(0, 1 + length);
        pending = pending.subarray(1 + length);
        if (message[0] === 0x41) dropped++;
        else out.push(message);
      }
      if (out.length > 0) client.write(Buffer.concat(out));
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: own } = server.address() as AddressInfo;
  return {
    url(url) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(own);
      return u.toString();
    },
    get dropped() {
      return dropped;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
