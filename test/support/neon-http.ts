/**
 * A local server of Neon's SQL-over-HTTP protocol, in front of the real
 * PostgreSQL, so drizzle's neon-http driver (and `neon()` from
 * `@neondatabase/serverless`) can run here as they run against Neon.
 *
 * The protocol, as the driver speaks it: `POST` a JSON body, either one query
 * `{ query, params }` or a batch `{ queries: [{ query, params }, ...] }`, with
 * the target in the `Neon-Connection-String` header and options in
 * `Neon-Batch-Isolation-Level`, `Neon-Batch-Read-Only` and
 * `Neon-Batch-Deferrable`. Values go both ways as Postgres text
 * (`Neon-Raw-Text-Output: true`); the answer is `{ command, rowCount, fields,
 * rows }` per query (rows as arrays, fields with their type OIDs), a batch's
 * as `{ results: [...] }`, and a database error is a 400 whose body carries
 * the error's fields. A batch runs in one transaction: all of it commits, or
 * none of it.
 *
 * This is a protocol server, not a mock: every statement runs on PostgreSQL.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';

/** A running server. */
export interface NeonHttpServer {
  /** The URL to set as `neonConfig.fetchEndpoint`. */
  endpoint: string;
  /** HTTP requests served (each is one round trip of the driver). */
  readonly requests: number;
  close(): Promise<void>;
}

interface QueryIn {
  query: string;
  params?: (string | null)[];
}

// Every value stays text, as Neon sends it; the driver parses by type OID.
const rawTypes = { getTypeParser: () => (value: string) => value };

const ERROR_FIELDS = ['severity', 'code', 'detail', 'hint', 'position', 'internalPosition', 'internalQuery', 'where', 'schema', 'table', 'column', 'dataType', 'constraint', 'file', 'line', 'routine'] as const;

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function run(client: pg.PoolClient, q: QueryIn) {
  const result = await client.query({ text: q.query, values: q.params ?? [], rowMode: 'array', types: rawTypes } as pg.QueryConfig);
  return {
    command: result.command,
    rowCount: result.rowCount,
    fields: result.fields.map((f) => ({
      name: f.name,
      dataTypeID: f.dataTypeID,
      tableID: f.tableID,
      columnID: f.columnID,
      dataTypeSize: f.dataTypeSize,
      dataTypeModifier: f.dataTypeModifier,
      format: 'text',
    })),
    rows: result.rows,
    rowAsArray: true,
  };
}

const ISOLATION: Record<string, string> = {
  ReadUncommitted: 'READ UNCOMMITTED',
  ReadCommitted: 'READ COMMITTED',
  RepeatableRead: 'REPEATABLE READ',
  Serializable: 'SERIALIZABLE',
};

/** Starts the server on a free port of 127.0.0.1. It serves only connection strings to `allowedDatabaseUrl`'s server. */
export async function startNeonHttp(allowedDatabaseUrl: string): Promise<NeonHttpServer> {
  const allowed = new URL(allowedDatabaseUrl);
  const pools = new Map<string, pg.Pool>();
  let requests = 0;
  const poolFor = (connectionString: string) => {
    const u = new URL(connectionString);
    if (u.hostname !== allowed.hostname || (u.port || '5432') !== (allowed.port || '5432')) {
      throw Object.assign(new Error('connection string names another server'), { status: 403 });
    }
    let pool = pools.get(connectionString);
    if (!pool) {
      pool = new pg.Pool({ connectionString, max: 10 });
      pools.set(connectionString, pool);
    }
    return pool;
  };

  const server: Server = createServer(async (req, res) => {
    requests++;
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.method !== 'POST' || new URL(req.url ?? '/', 'http://x').pathname !== '/sql') return send(404, { message: 'not found' });
    let client: pg.PoolClient | undefined;
    let inTransaction = false;
    try {
      const target = req.headers['neon-connection-string'];
      if (typeof target !== 'string') return send(400, { message: 'missing Neon-Connection-String' });
      const body = (await readJson(req)) as QueryIn | { queries: QueryIn[] };
      client = await poolFor(target).connect();
      if ('queries' in body) {
        const level = ISOLATION[String(req.headers['neon-batch-isolation-level'] ?? '')];
        const modes = [
          level ? `ISOLATION LEVEL ${level}` : '',
          req.headers['neon-batch-read-only'] === 'true' ? 'READ ONLY' : '',
          req.headers['neon-batch-deferrable'] === 'true' ? 'DEFERRABLE' : '',
        ].filter(Boolean);
        await client.query(`BEGIN ${modes.join(' ')}`);
        inTransaction = true;
        const results = [];
        for (const q of body.queries) results.push(await run(client, q));
        await client.query('COMMIT');
        inTransaction = false;
        return send(200, { results });
      }
      return send(200, await run(client, body));
    } catch (err) {
      if (inTransaction) await client?.query('ROLLBACK').catch(() => undefined);
      const e = err as Error & Record<string, unknown>;
      if (e.status === 403) return send(403, { message: e.message });
      const fields: Record<string, unknown> = { message: e.message };
      for (const f of ERROR_FIELDS) if (e[f] !== undefined) fields[f] = e[f];
      return send(400, fields);
    } finally {
      client?.release();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}/sql`,
    get requests() {
      return requests;
    },
    async close() {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await Promise.all([...pools.values()].map((p) => p.end()));
    },
  };
}
