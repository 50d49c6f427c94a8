/**
 * A TCP proxy in front of the test database that copies bytes both ways,
 * unchanged, and counts connections: what the WebSocket proxy does for the
 * Neon driver, for node-postgres (directly or behind Miniflare's Hyperdrive),
 * so a test can see when an invocation's pool has closed, whichever driver
 * it used.
 */
import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net';

/** A running proxy. */
export interface TcpProxy {
  /** A connection string through the proxy, for the database, role and password of `url`. */
  url(url: string): string;
  /** Connections open right now. */
  readonly open: number;
  /** Connections opened since the start. */
  readonly opened: number;
  close(): Promise<void>;
}

/** Starts a proxy on a free port of 127.0.0.1 towards `host:port`. */
export async function startTcpProxy(host: string, port: number): Promise<TcpProxy> {
  let open = 0;
  let opened = 0;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    open++;
    opened++;
    const upstream = createConnection({ host, port });
    upstream.setNoDelay(true);
    client.setNoDelay(true);
    sockets.add(client).add(upstream);
    let closed = false;
    const closeBoth = () => {
      if (closed) return;
      closed = true;
      open--;
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('close', closeBoth).on('error', closeBoth);
    upstream.on('close', closeBoth).on('error', closeBoth);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port: local } = server.address() as AddressInfo;
  return {
    url(url) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(local);
      return u.toString();
    },
    get open() {
      return open;
    },
    get opened() {
      return opened;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
