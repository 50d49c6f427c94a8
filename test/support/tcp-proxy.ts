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
    // One side gone, the other is ended, not destroyed: a destroy answers the
    // peer's next bytes with a reset, and the peer may be a socket without an
    // error listener (Miniflare's Hyperdrive proxy pipes its sockets with
    // none), which a reset crashes.
    let counted = false;
    const closeBoth = () => {
      if (!counted) {
        counted = true;
        open--;
      }
      for (const s of [client, upstream]) {
        if (!s.destroyed) s.end();
        setTimeout(() => s.destroy(), 1_000).unref();
      }
    };
    for (const s of [client, upstream]) {
      s.on('close', () => {
        sockets.delete(s);
        closeBoth();
      });
      s.on('error', closeBoth);
    }
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
