/**
 * Miniflare's Hyperdrive proxy (the local stand-in `wrangler dev` uses too)
 * pipes the socket workerd opens to a socket of its own towards the database,
 * and gives neither an error listener. A reset from either end, workerd
 * killed with bytes unread or a backend terminated, is then an uncaught
 * exception in the process that runs Miniflare: in a test file, an error
 * that fails the run though every test passed (measured: 7 of 8 Workers
 * killed while querying in a loop).
 *
 * Imported for its effect: sockets that Miniflare's code makes or accepts
 * in this process get a listener that closes the socket and ends the one it
 * is piped into, as a pipe does on a clean end (a reset alone would leave
 * the database's side open, and its backend with it). Sockets made by any
 * other code are left as they are.
 */
import net from 'node:net';

const fromMiniflare = () => /[\\/]miniflare[\\/]/.test(new Error().stack ?? '');
/** Closes a socket that failed, and ends the sockets it was piped into. */
function onError(this: net.Socket): void {
  const piped = (this as unknown as { _readableState?: { pipes?: unknown[] } })._readableState?.pipes ?? [];
  this.destroy();
  for (const to of piped) (to as net.Socket).end?.();
}

const { createServer, connect, createConnection } = net;

net.createServer = function (this: unknown, ...args: unknown[]) {
  const server = (createServer as (...a: unknown[]) => net.Server).apply(this, args);
  if (fromMiniflare()) server.on('connection', (socket: net.Socket) => socket.on('error', onError));
  return server;
} as typeof net.createServer;

for (const [name, original] of [
  ['connect', connect],
  ['createConnection', createConnection],
] as const) {
  (net as unknown as Record<string, unknown>)[name] = function (this: unknown, ...args: unknown[]) {
    const socket = (original as (...a: unknown[]) => net.Socket).apply(this, args);
    if (fromMiniflare()) socket.on('error', onError);
    return socket;
  };
}
