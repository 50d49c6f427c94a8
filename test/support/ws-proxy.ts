/**
 * A WebSocket-to-TCP proxy, the local stand-in for the one in front of a Neon
 * database: the Neon serverless driver (in Node or in workerd) opens
 * `ws://127.0.0.1:PORT/v1?address=HOST:PORT`, and every binary message is the
 * Postgres wire protocol, copied both ways to a TCP socket on the real server.
 *
 * It is a transport, not a fake: the bytes the driver writes reach the real
 * PostgreSQL unchanged. It only connects to the addresses it is told to allow,
 * and it counts connections, so tests can see when a pool was closed.
 */
import { createConnection } from 'node:net';
import type { AddressInfo } from 'node:net';
import { WebSocketServer, type RawData } from 'ws';

/** A running proxy. */
export interface WsProxy {
  /** `host:port/v1`, the value of the worker's `NEON_WS_PROXY` binding (without scheme). */
  readonly address: string;
  /** WebSocket connections open right now. */
  readonly open: number;
  /** WebSocket connections opened since the start (or the last `resetCounts`). */
  readonly opened: number;
  /** Messages (driver writes) carried towards Postgres since the start (or the last `resetCounts`). */
  readonly messages: number;
  resetCounts(): void;
  close(): Promise<void>;
}

function toBuffer(data: RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data as ArrayBuffer);
}

/**
 * Starts a proxy on a free port of 127.0.0.1 that forwards to the Postgres at
 * `target` (`host:port`), the only address it accepts.
 */
export async function startWsProxy(target: string): Promise<WsProxy> {
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0, path: '/v1' });
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  let open = 0;
  let opened = 0;
  let messages = 0;

  server.on('connection', (ws, request) => {
    const address = new URL(request.url ?? '/', 'http://proxy').searchParams.get('address');
    if (address !== target) {
      ws.close(1008, 'address not allowed');
      return;
    }
    open++;
    opened++;
    const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))];
    const socket = createConnection({ host, port });
    socket.setNoDelay(true);
    // The driver may write (startup, password, first query) before the TCP
    // connection is up; keep those bytes until it is.
    const early: Buffer[] = [];
    let connected = false;
    socket.on('connect', () => {
      connected = true;
      for (const chunk of early.splice(0)) socket.write(chunk);
    });
    socket.on('data', (chunk) => {
      if (ws.readyState === ws.OPEN) ws.send(chunk);
    });
    let closed = false;
    const closeBoth = () => {
      if (closed) return;
      closed = true;
      open--;
      socket.destroy();
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close();
    };
    socket.on('close', closeBoth);
    socket.on('error', closeBoth);
    ws.on('message', (data) => {
      messages++;
      const chunk = toBuffer(data);
      if (connected) socket.write(chunk);
      else early.push(chunk);
    });
    ws.on('close', closeBoth);
    ws.on('error', closeBoth);
  });

  const { port } = server.address() as AddressInfo;
  return {
    address: `127.0.0.1:${port}/v1`,
    get open() {
      return open;
    },
    get opened() {
      return opened;
    },
    get messages() {
      return messages;
    },
    resetCounts() {
      opened = 0;
      messages = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of server.clients) client.terminate();
        server.close(() => resolve());
      }),
  };
}
