/**
 * A TCP proxy on 127.0.0.1 between some chaos processes and PostgreSQL, that
 * can drop every connection it carries (as a NAT or load balancer does) or
 * stall them (bytes held back, as on a congested link) for a while.
 */
import { createConnection, createServer, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

/** A running proxy. */
export interface TcpProxy {
  readonly port: number;
  /** Connections carried since the start. */
  readonly opened: number;
  /** Destroys every open connection, both ends. */
  drop(): number;
  /** Holds back all bytes, both ways, for `ms`, then lets them through. */
  stall(ms: number): void;
  close(): Promise<void>;
}

/** Starts a proxy on a free port forwarding to `targetPort` on 127.0.0.1. */
export async function startProxy(targetPort: number): Promise<TcpProxy> {
  const pairs = new Set<[Socket, Socket]>();
  let opened = 0;
  let stalledUntil = 0;
  const server = createServer((client) => {
    opened++;
    const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
    const pair: [Socket, Socket] = [client, upstream];
    pairs.add(pair);
    const close = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    const forward = (from: Socket, to: Socket) => {
      from.on('data', (chunk) => {
        const wait = stalledUntil - Date.now();
        if (wait <= 0) {
          to.write(chunk);
          return;
        }
        // Keep order: pause the source until the stall is over.
        from.pause();
        setTimeout(() => {
          if (!to.destroyed) to.write(chunk);
          from.resume();
        }, wait);
      });
    };
    forward(client, upstream);
    forward(upstream, client);
    for (const s of pair) {
      s.on('error', close);
      s.on('close', close);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    get opened() {
      return opened;
    },
    drop() {
      const n = pairs.size;
      for (const [a, b] of [...pairs]) {
        a.destroy();
        b.destroy();
      }
      pairs.clear();
      return n;
    },
    stall(ms) {
      stalledUntil = Math.max(stalledUntil, Date.now() + ms);
    },
    close() {
      for (const [a, b] of pairs) {
        a.destroy();
        b.destroy();
      }
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
