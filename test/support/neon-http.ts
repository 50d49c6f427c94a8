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
 * (`Neon-Raw-Text-Output: true`); the answer is `{ fields, rows, command,
 * rowCount, rowAsArray }` per query (fields with their type OIDs), a batch's
 * as `{ results: [...] }`, and an error is a JSON body carrying the error's
 * fields. A batch runs in one transaction: all of it commits, or none of it.
 *
 * This is a protocol server, not a mock: every statement runs on PostgreSQL.
 * And it keeps the rules of Neon's proxy, never laxer ones, or code that
 * passes here would fail on Neon. Each rule below names where it was read in
 * neondatabase/neon (proxy/src/serverless/, as of commit 6a35a3e9, March 2026):
 * `sql_over_http.rs` (the handler), `http_util.rs` (`get_conn_info`),
 * `error.rs` (error texts), `conn_pool_lib.rs` and
 * libs/proxy/tokio-postgres2/src/client.rs (the session reset),
 * libs/proxy/tokio-postgres2/src/query.rs (`query_txt`), `json.rs`
 * (`json_to_pg_text`), proxy/src/binary/proxy.rs (the size limits).
 */
import { createServer, type IncomingMessage, type ServerResponse, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';

/** The proxy's default `--sql-over-http-max-request-size-bytes` (proxy/src/binary/proxy.rs): 10 MiB. */
export const NEON_HTTP_MAX_REQUEST_BYTES = 10 * 1024 * 1024;
/** The proxy's default `--sql-over-http-max-response-size-bytes` (proxy/src/binary/proxy.rs): 10 MiB. */
export const NEON_HTTP_MAX_RESPONSE_BYTES = 10 * 1024 * 1024;

/** How the server pools its connections to PostgreSQL. */
export interface NeonHttpOptions {
  /**
   * Connections per connection string (10 unless given). 1 makes every
   * request reuse the last one's connection, once it is reset: what a test
   * of the reset needs to see.
   */
  connectionsPerTarget?: number;
}

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
  params: (string | null)[];
  arrayMode?: boolean;
}

/** An error the proxy answers itself (not Postgres's): a status and its message, as in error.rs. */
class ProxyError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

// Every value stays text, as Neon sends it; the driver parses by type OID.
// (pg also reads `types` as the Parse message's parameter types: this object
// has no length, so Parse names none and Postgres infers them, as query_txt.)
const rawTypes = { getTypeParser: () => (value: string) => value };

// The body of an error, key for key as sql_over_http.rs `handle` writes it:
// every key present, null (or "" for code and severity) where there is none.
const DB_FIELDS = ['code', 'detail', 'hint', 'position', 'internalPosition', 'internalQuery', 'severity', 'where', 'table', 'column', 'schema', 'dataType', 'constraint', 'file', 'line', 'routine'] as const;

function errorBody(err: unknown): Record<string, unknown> {
  const e = err as Error & Record<string, unknown>;
  const isDb = !(err instanceof ProxyError) && typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code);
  const body: Record<string, unknown> = { message: e.message };
  for (const f of DB_FIELDS) body[f] = isDb && e[f] !== undefined ? e[f] : null;
  if (!isDb) {
    body.code = '';
    body.severity = '';
  }
  return body;
}

// json.rs `json_to_pg_text`: a string parameter goes as it is, null as NULL,
// an array as a Postgres array literal, anything else as its JSON text.
function toPgText(v: unknown): string | null {
  if (v === null) return null;
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) return toPgArray(v);
  return JSON.stringify(v);
}

// json.rs `json_array_to_pg_array`: inside an array, strings are JSON-quoted
// and objects become quoted JSON text.
function toPgArray(v: unknown): string | null {
  if (v === null) return null;
  if (Array.isArray(v)) return `{${v.map((x) => toPgArray(x) ?? 'NULL').join(',')}}`;
  if (typeof v === 'object') return JSON.stringify(JSON.stringify(v));
  return JSON.stringify(v);
}

/** What `get_conn_info` (http_util.rs) takes from `Neon-Connection-String`, or its refusal. */
function connInfo(headers: IncomingMessage['headers']): URL {
  const header = headers['neon-connection-string'];
  if (typeof header !== 'string') throw new ProxyError(400, 'invalid header: neon-connection-string');
  let u: URL;
  try {
    u = new URL(header);
  } catch (err) {
    throw new ProxyError(400, `invalid connection string: ${(err as Error).message}`);
  }
  if (u.protocol !== 'postgres:' && u.protocol !== 'postgresql:') throw new ProxyError(400, 'incorrect scheme');
  if (u.username === '') throw new ProxyError(400, 'missing username');
  // The proxy (not an auth broker: accept_jwts is false) takes a password
  // only, and refuses a bearer token with the same words.
  if (headers.authorization !== undefined || u.password === '') {
    throw new ProxyError(400, 'missing authentication credentials: required password');
  }
  // The endpoint is the host name's first label. The url crate parses a
  // postgres:// host as an opaque host, a domain even when it reads as IPv4
  // (so 127.0.0.1 names endpoint "127", unknown below); only an IPv6 literal
  // or no host at all is "missing hostname".
  if (u.hostname === '' || u.hostname.startsWith('[')) throw new ProxyError(400, 'missing hostname');
  return u;
}

/** The endpoint a host name names, as `get_conn_info` reads it: its first label. */
function endpointOf(u: URL): string {
  return u.hostname.split('.')[0]!;
}

/** The endpoint id the stand-in serves; any other is unknown to it, as to Neon's control plane. */
export const NEON_HTTP_ENDPOINT = 'ep-outlive-stand-in';

/**
 * `databaseUrl` as Neon hands out a connection string: the same role,
 * password and database, on a host name whose first label is the endpoint
 * ({@link NEON_HTTP_ENDPOINT}). `.invalid` never resolves, so nothing but
 * the stand-in can be reached with it.
 */
export function neonUrl(databaseUrl: string): string {
  const u = new URL(databaseUrl);
  u.hostname = `${NEON_HTTP_ENDPOINT}.neon.invalid`;
  u.port = '';
  return u.toString();
}

type Isolation = 'READ UNCOMMITTED' | 'READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE';

// sql_over_http.rs `map_header_to_isolation_level`: these four spellings, byte for byte.
const ISOLATION: Record<string, Isolation> = {
  Serializable: 'SERIALIZABLE',
  ReadUncommitted: 'READ UNCOMMITTED',
  ReadCommitted: 'READ COMMITTED',
  RepeatableRead: 'REPEATABLE READ',
};

interface Options {
  arrayMode: boolean;
  isolation?: { header: string; sql: Isolation };
  readOnly: boolean;
  deferrable: boolean;
}

/**
 * sql_over_http.rs `HttpHeaders::try_parse`, run for every request (a single
 * query too): an isolation level header other than the four is refused;
 * read-only, deferrable and array mode are on only when exactly `true`.
 */
function parseOptions(headers: IncomingMessage['headers']): Options {
  const level = headers['neon-batch-isolation-level'];
  let isolation: Options['isolation'];
  if (level !== undefined) {
    const sql = typeof level === 'string' && Object.hasOwn(ISOLATION, level) ? ISOLATION[level] : undefined;
    if (!sql) throw new ProxyError(400, 'invalid isolation level');
    isolation = { header: level as string, sql };
  }
  // The stand-in returns Postgres text only; the proxy would turn values into
  // JSON numbers and booleans without this header. Refuse rather than answer
  // in a form Neon would not.
  if (headers['neon-raw-text-output'] !== 'true') {
    throw new ProxyError(400, 'the Neon stand-in serves Neon-Raw-Text-Output: true only, as @neondatabase/serverless sends it');
  }
  return {
    arrayMode: headers['neon-array-mode'] === 'true',
    isolation,
    readOnly: headers['neon-batch-read-only'] === 'true',
    deferrable: headers['neon-batch-deferrable'] === 'true',
  };
}

/** http/mod.rs `read_body_with_limit`: refused on its Content-Length, or as soon as it grows past the limit. */
function readBody(req: IncomingMessage): Promise<Buffer> {
  const tooLarge = () => new ProxyError(413, `request is too large (max is ${NEON_HTTP_MAX_REQUEST_BYTES} bytes)`);
  if (Number(req.headers['content-length'] ?? 0) > NEON_HTTP_MAX_REQUEST_BYTES) return Promise.reject(tooLarge());
  // Events rather than for-await: leaving a for-await early destroys the
  // socket, and the client would never read the 413.
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let refused = false;
    req.on('data', (chunk: Buffer) => {
      if (refused) return; // drained, so the answer can be read
      size += chunk.length;
      if (size <= NEON_HTTP_MAX_REQUEST_BYTES) return void chunks.push(chunk);
      refused = true;
      chunks.length = 0;
      reject(tooLarge());
    });
    req.on('end', () => refused || resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** sql_over_http.rs `Payload`: serde's untagged enum of one query or a batch; params default to []. */
function parsePayload(body: Buffer): QueryIn | { queries: QueryIn[] } {
  const refuse = (why: string) => new ProxyError(400, `could not parse the HTTP request body: ${why}`);
  let json: unknown;
  try {
    json = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw refuse((err as Error).message);
  }
  const query = (q: unknown): QueryIn | undefined => {
    const o = q as Record<string, unknown>;
    if (typeof o !== 'object' || o === null || typeof o.query !== 'string') return undefined;
    if (o.params !== undefined && !Array.isArray(o.params)) return undefined;
    if (o.arrayMode !== undefined && o.arrayMode !== null && typeof o.arrayMode !== 'boolean') return undefined;
    return { query: o.query, params: ((o.params as unknown[]) ?? []).map(toPgText), arrayMode: (o.arrayMode as boolean | null) ?? undefined };
  };
  const single = query(json);
  if (single) return single;
  const queries = (json as { queries?: unknown })?.queries;
  if (Array.isArray(queries)) {
    const all = queries.map(query);
    if (all.every((q): q is QueryIn => q !== undefined)) return { queries: all };
  }
  throw refuse('data did not match any variant of untagged enum Payload');
}

/**
 * The session reset the proxy runs on a connection before it goes back to
 * its pool (conn_pool_lib.rs `EndpointConnPool::put` calls
 * tokio-postgres2 client.rs `reset_session_background`), word for word: no
 * SET, cursor, prepared statement, LISTEN, advisory lock, temporary table or
 * open transaction of one request reaches the next.
 */
const RESET_SESSION = `ROLLBACK;
CLOSE ALL;
SET SESSION AUTHORIZATION DEFAULT;
RESET ALL;
DEALLOCATE ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all();
DISCARD TEMP;
DISCARD SEQUENCES;`;

/** Serialises the answer as the proxy does, checking its size where the proxy checks it. */
class ResponseWriter {
  private readonly parts: string[] = [];
  private size = 0;

  write(s: string) {
    this.parts.push(s);
    this.size += Buffer.byteLength(s);
  }

  // sql_over_http.rs `query_to_json`: before each row, the answer written so
  // far (the whole batch's) must not exceed the limit; the last row may.
  checkBeforeRow() {
    if (this.size > NEON_HTTP_MAX_RESPONSE_BYTES) {
      throw new ProxyError(507, `response is too large (max is ${NEON_HTTP_MAX_RESPONSE_BYTES} bytes)`);
    }
  }

  toString() {
    return this.parts.join('');
  }
}

/**
 * One query as tokio-postgres2 `query_txt` runs it: Parse (no parameter
 * types: Postgres infers them), Bind (every parameter as text), Execute,
 * Sync, in the unnamed statement. `queryMode: 'extended'` makes pg do so even
 * without parameters, where it would otherwise send a simple Query, which
 * runs several statements that Neon refuses (42601).
 */
async function run(client: pg.PoolClient, q: QueryIn, options: Options, out: ResponseWriter) {
  const result = await client.query({ text: q.query, values: q.params, rowMode: 'array', types: rawTypes, queryMode: 'extended' } as pg.QueryConfig);
  const fields = result.fields.map((f) => ({
    name: f.name,
    dataTypeID: f.dataTypeID,
    tableID: f.tableID,
    columnID: f.columnID,
    dataTypeSize: f.dataTypeSize,
    dataTypeModifier: f.dataTypeModifier,
    format: 'text',
  }));
  const arrayMode = q.arrayMode ?? options.arrayMode;
  out.write(`{"fields":${JSON.stringify(fields)},"rows":[`);
  (result.rows as (string | null)[][]).forEach((row, i) => {
    out.checkBeforeRow();
    const value = arrayMode ? row : Object.fromEntries(fields.map((f, j) => [f.name, row[j]]));
    out.write((i ? ',' : '') + JSON.stringify(value));
  });
  out.write(`],"command":${JSON.stringify(result.command ?? '')},"rowCount":${JSON.stringify(result.rowCount ?? null)},"rowAsArray":${arrayMode}}`);
}

/**
 * Starts the server on a free port of 127.0.0.1. Its endpoint
 * ({@link NEON_HTTP_ENDPOINT}; build connection strings with
 * {@link neonUrl}) is served by the PostgreSQL server of `backendDatabaseUrl`
 * (its host and port; user, password and database come from each request's
 * connection string), as Neon's proxy routes an endpoint to its compute.
 */
export async function startNeonHttp(backendDatabaseUrl: string, options: NeonHttpOptions = {}): Promise<NeonHttpServer> {
  const max = options.connectionsPerTarget ?? 10;
  const backend = new URL(backendDatabaseUrl);
  const pools = new Map<string, pg.Pool>();
  let requests = 0;
  const poolFor = (target: URL) => {
    const u = new URL(target.toString());
    u.protocol = 'postgres:';
    u.hostname = backend.hostname;
    u.port = backend.port;
    // Options of the client's TLS, which the proxy terminates: not the compute's business.
    for (const k of ['sslmode', 'channel_binding', 'sslrootcert', 'sslcert', 'sslkey']) u.searchParams.delete(k);
    const key = u.toString();
    let pool = pools.get(key);
    if (!pool) {
      pool = new pg.Pool({ connectionString: key, max });
      pool.on('error', () => undefined); // an idle connection's end is not this server's error
      pools.set(key, pool);
    }
    return pool;
  };

  const send = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => {
    res.writeHead(status, { 'content-type': 'application/json', 'access-control-allow-origin': '*', ...headers });
    res.end(body);
  };

  const server: Server = createServer(async (req, res) => {
    requests++;
    if (req.method !== 'POST' || new URL(req.url ?? '/', 'http://x').pathname !== '/sql') {
      req.resume();
      return send(res, 404, JSON.stringify({ message: 'not found' }));
    }
    let client: pg.PoolClient | undefined;
    // What happens to the connection after the answer: reset and pooled, or
    // thrown away ("discard" in sql_over_http.rs: after a failed single query,
    // a failed BEGIN or COMMIT).
    let discard = false;
    try {
      // The order of handle_inner / handle_db_inner: connection string, headers, body.
      const target = connInfo(req.headers);
      const options = parseOptions(req.headers);
      const payload = parsePayload(await readBody(req));
      // Neon's control plane answers for an endpoint it does not know (its
      // words are not in the proxy's source; the status is: EndpointNotFound
      // is a user error, 400, control_plane/errors.rs).
      if (endpointOf(target) !== NEON_HTTP_ENDPOINT) {
        throw new ProxyError(400, `endpoint ${endpointOf(target)} not found (the stand-in serves ${NEON_HTTP_ENDPOINT} only)`);
      }
      try {
        client = await poolFor(target).connect();
      } catch (err) {
        throw Object.assign(err as Error, { status: 400 });
      }
      const out = new ResponseWriter();
      if (!('queries' in payload)) {
        try {
          await run(client, payload, options, out);
        } catch (err) {
          discard = true;
          throw err;
        }
        return send(res, 200, out.toString());
      }
      const modes = [
        options.isolation ? ` ISOLATION LEVEL ${options.isolation.sql}` : '',
        options.readOnly ? ' READ ONLY' : '',
        options.deferrable ? ' DEFERRABLE' : '',
      ].filter(Boolean);
      try {
        // tokio-postgres2 transaction_builder.rs, as a simple query.
        await client.query(`START TRANSACTION${modes.join(',')}`);
      } catch (err) {
        discard = true;
        throw err;
      }
      out.write('{"results":[');
      for (const [i, q] of payload.queries.entries()) {
        if (i) out.write(',');
        await run(client, q, options, out); // on failure the reset's ROLLBACK ends the transaction
      }
      out.write(']}');
      try {
        await client.query('COMMIT');
      } catch (err) {
        discard = true;
        throw err;
      }
      // A batch's answer repeats the options it ran with.
      const echo: Record<string, string> = {};
      if (options.readOnly) echo['neon-batch-read-only'] = 'true';
      if (options.deferrable) echo['neon-batch-deferrable'] = 'true';
      if (options.isolation) echo['neon-batch-isolation-level'] = options.isolation.header;
      return send(res, 200, out.toString(), echo);
    } catch (err) {
      req.resume(); // a refused body is still drained, so the client sees the answer
      const status = (err as { status?: number }).status ?? 400;
      return send(res, status, JSON.stringify(errorBody(err)));
    } finally {
      // After the answer, as the proxy does it: the reset runs when the
      // connection goes back to the pool, not before the client hears back.
      if (client) {
        const c = client;
        if (discard) c.release(true);
        else c.query(RESET_SESSION).then(() => c.release(), (e: Error) => c.release(e));
      }
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
