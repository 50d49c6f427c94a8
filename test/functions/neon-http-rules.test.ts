/**
 * The local Neon SQL-over-HTTP server (test/support/neon-http.ts) keeps the
 * rules of Neon's real proxy, never laxer ones: a laxer stand-in would let
 * code pass here that fails on Neon. Each rule below is read from the proxy's
 * source (neondatabase/neon, proxy/src/serverless/sql_over_http.rs and its
 * neighbours; see the stand-in's comments for where).
 */
import { neon, neonConfig } from '@neondatabase/serverless';
import { afterAll, describe, expect, it } from 'vitest';
import { freshDb } from '../support/db.js';
import { roleUrl } from '../support/functions-db.js';
import { NEON_HTTP_MAX_REQUEST_BYTES, NEON_HTTP_MAX_RESPONSE_BYTES, neonUrl as asNeonUrl, startNeonHttp } from '../support/neon-http.js';

const db = await freshDb();
await db.pool.query(`CREATE TABLE notes (id int PRIMARY KEY, body text)`);
const { url: roleDbUrl } = await roleUrl(db);
// The proxy connects to the compute itself; LISTEN and session locks need the server, not a pooler.
// One connection: each request runs where the one before ran, after its reset.
const server = await startNeonHttp(db.directUrl, { connectionsPerTarget: 1 });
afterAll(() => server.close());
neonConfig.fetchEndpoint = server.endpoint;

/** The role's URL as Neon hands it out (a host name whose first label names the endpoint), then changed. */
function neonUrl(change: (u: URL) => void = () => undefined): string {
  const u = new URL(asNeonUrl(roleDbUrl));
  change(u);
  return u.toString();
}

interface Answer {
  status: number;
  headers: Headers;
  body: Record<string, unknown>;
}

/** One request as the driver makes it (its headers), with `headers` changed. */
async function post(body: unknown, headers: Record<string, string | undefined> = {}): Promise<Answer> {
  const all: Record<string, string | undefined> = {
    'Neon-Connection-String': neonUrl(),
    'Neon-Raw-Text-Output': 'true',
    'Neon-Array-Mode': 'true',
    ...headers,
  };
  const res = await fetch(server.endpoint, {
    method: 'POST',
    body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: Object.fromEntries(Object.entries(all).filter((e): e is [string, string] => e[1] !== undefined)),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Record<string, unknown> };
}

async function one(query: string, params: unknown[] = []): Promise<unknown[][]> {
  const a = await post({ query, params });
  expect(a.body).not.toHaveProperty('message');
  expect(a.status).toBe(200);
  return a.body.rows as unknown[][];
}

describe('every query goes through the extended protocol with untyped text parameters', () => {
  it('refuses a parameterless multi-statement query with 42601, as Neon does', async () => {
    const a = await post({ query: 'SELECT 1; SELECT 2' });
    expect(a.status).toBe(400);
    expect(a.body).toMatchObject({ code: '42601', message: 'cannot insert multiple commands into a prepared statement' });
    await expect(neon(neonUrl()).query('SELECT 1; SELECT 2')).rejects.toMatchObject({ code: '42601' });
  });

  it('refuses it inside a batch too, and the batch rolls back', async () => {
    const a = await post({ queries: [{ query: `INSERT INTO notes VALUES (1, 'a')`, params: [] }, { query: 'SELECT 1; SELECT 2', params: [] }] });
    expect(a.status).toBe(400);
    expect(a.body).toMatchObject({ code: '42601' });
    expect((await db.pool.query('SELECT count(*)::int AS n FROM notes')).rows[0].n).toBe(0);
  });

  it('leaves the parameter types to Postgres: unspecified, sent as text', async () => {
    expect(await one('SELECT $1::int + 1, $2', ['41', 'x'])).toEqual([['42', 'x']]);
    // Where nothing gives the type away, Postgres cannot infer it, on Neon as here.
    const a = await post({ query: 'SELECT pg_typeof($1)', params: ['x'] });
    expect(a).toMatchObject({ status: 400, body: { code: '42P18', message: 'could not determine data type of parameter $1' } });
  });

  it('turns non-string JSON parameters into text as the proxy does (json_to_pg_text)', async () => {
    const rows = await one('SELECT $1::text, $2::text, $3::text, $4::text, $5::text IS NULL', [7.5, true, { a: 'b' }, [1, 'two', null, [3], { c: 1 }], null]);
    expect(rows).toEqual([['7.5', 'true', '{"a":"b"}', '{1,"two",NULL,{3},"{\\"c\\":1}"}', 't']]);
  });
});

describe('batch transaction options are read as the proxy reads them', () => {
  const show = [
    { query: 'SHOW transaction_isolation', params: [] },
    { query: 'SHOW transaction_read_only', params: [] },
    { query: 'SHOW transaction_deferrable', params: [] },
  ];
  const values = (a: Answer) => (a.body.results as { rows: string[][] }[]).map((r) => r.rows[0]![0]);

  it('refuses an isolation level it does not know with 400 "invalid isolation level"', async () => {
    for (const level of ['serializable', 'SERIALIZABLE', 'Snapshot', 'read committed', '']) {
      const a = await post({ queries: show }, { 'Neon-Batch-Isolation-Level': level });
      expect(a.status, level).toBe(400);
      expect(a.body.message, level).toBe('invalid isolation level');
    }
  });

  it('refuses it on a single query as well: the headers are parsed before the body', async () => {
    const a = await post({ query: 'SELECT 1', params: [] }, { 'Neon-Batch-Isolation-Level': 'Chaos' });
    expect(a).toMatchObject({ status: 400, body: { message: 'invalid isolation level' } });
  });

  it('applies the four levels it knows, and echoes the options of a batch in the response headers', async () => {
    const a = await post({ queries: show }, { 'Neon-Batch-Isolation-Level': 'Serializable', 'Neon-Batch-Read-Only': 'true', 'Neon-Batch-Deferrable': 'true' });
    expect(a.status).toBe(200);
    expect(values(a)).toEqual(['serializable', 'on', 'on']);
    expect(a.headers.get('neon-batch-isolation-level')).toBe('Serializable');
    expect(a.headers.get('neon-batch-read-only')).toBe('true');
    expect(a.headers.get('neon-batch-deferrable')).toBe('true');
    for (const [level, shown] of [['ReadUncommitted', 'read uncommitted'], ['ReadCommitted', 'read committed'], ['RepeatableRead', 'repeatable read']]) {
      expect(values(await post({ queries: show }, { 'Neon-Batch-Isolation-Level': level! }))[0]).toBe(shown);
    }
  });

  it('takes read-only and deferrable only when exactly "true"', async () => {
    for (const v of ['True', 'TRUE', '1', 'yes', 'on']) {
      const a = await post({ queries: show }, { 'Neon-Batch-Isolation-Level': 'Serializable', 'Neon-Batch-Read-Only': v, 'Neon-Batch-Deferrable': v });
      expect(a.status, v).toBe(200);
      expect(values(a), v).toEqual(['serializable', 'off', 'off']);
      expect(a.headers.get('neon-batch-read-only'), v).toBeNull();
    }
  });

  it('rolls back a write in a read-only batch, as the driver asks', async () => {
    const sql = neon(neonUrl());
    await expect(sql.transaction([sql`INSERT INTO notes VALUES (2, 'ro')`], { readOnly: true })).rejects.toMatchObject({ code: '25006' });
    const [r] = await sql.transaction([sql`SHOW transaction_isolation`], { isolationLevel: 'RepeatableRead' });
    expect(r).toEqual([{ transaction_isolation: 'repeatable read' }]);
  });
});

describe('the connection string must carry a user, a password and a host name', () => {
  const expectRefused = (a: Answer, message: string) => {
    expect(a.status).toBe(400);
    // Not a database error: the proxy's error body with an empty code.
    expect(a.body).toMatchObject({ message, code: '' });
  };

  it('refuses a request without Neon-Connection-String', async () => {
    expectRefused(await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': undefined }), 'invalid header: neon-connection-string');
  });

  it('refuses a connection string without a password', async () => {
    expectRefused(await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl((u) => (u.password = '')) }), 'missing authentication credentials: required password');
  });

  it('refuses a bearer token: the proxy (not an auth broker) takes passwords only', async () => {
    expectRefused(await post({ query: 'SELECT 1' }, { Authorization: 'Bearer abc' }), 'missing authentication credentials: required password');
  });

  it('refuses an IPv6 address where the endpoint host name should be', async () => {
    expectRefused(await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl((u) => (u.hostname = '[::1]')) }), 'missing hostname');
  });

  it('reads an IPv4 address as endpoint "127", which no one serves', async () => {
    // postgres:// is no special scheme: its host is opaque, a domain to the url crate.
    for (const host of ['127.0.0.1', 'ep-someone-else.neon.invalid']) {
      const a = await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl((u) => (u.hostname = host)) });
      expect(a.status, host).toBe(400);
      expect(a.body, host).toMatchObject({ code: '' });
    }
  });

  it('refuses a missing user, another scheme, an unparsable URL', async () => {
    expectRefused(await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl((u) => (u.username = '')) }), 'missing username');
    expectRefused(await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl().replace(/^postgres(ql)?:/, 'mysql:') }), 'incorrect scheme');
    const a = await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': 'not a url' });
    expect(a.status).toBe(400);
    expect(a.body.message).toMatch(/^invalid connection string: /);
  });

  it('serves postgresql:// as well as postgres://', async () => {
    expect((await post({ query: 'SELECT 1' }, { 'Neon-Connection-String': neonUrl().replace(/^postgres:/, 'postgresql:') })).status).toBe(200);
  });
});

describe('no session state survives from one request to the next', () => {
  // The server has one connection, so each request runs on the connection
  // the one before used: what survived there would show up (each check
  // soft, so a leak of one kind does not hide another).
  it('forgets SET, temporary tables, prepared statements, cursors, roles, LISTEN and advisory locks', async () => {
    for (let round = 0; round < 3; round++) {
      await one(`SET statement_timeout = '4321ms'`);
      expect.soft(await one('SHOW statement_timeout')).toEqual([['0']]);
      await one(`CREATE TEMP TABLE scratch (x int)`);
      expect.soft(await one(`SELECT to_regclass('scratch')::text`)).toEqual([[null]]);
      await one(`PREPARE leftover AS SELECT 1`);
      expect.soft(await one('SELECT count(*) FROM pg_prepared_statements')).toEqual([['0']]);
      await one(`DECLARE leftover CURSOR WITH HOLD FOR SELECT 1`);
      expect.soft(await one(`SELECT count(*) FROM pg_cursors WHERE name = 'leftover'`)).toEqual([['0']]);
      await one('SET ROLE pg_monitor');
      expect.soft(await one('SELECT current_user = session_user')).toEqual([['t']]);
      await one(`LISTEN leftover`);
      expect.soft(await one('SELECT count(*) FROM pg_listening_channels()')).toEqual([['0']]);
      const [[pid]] = (await one('SELECT pg_backend_pid(), pg_advisory_lock(424242)')) as [[string]];
      expect.soft(await one('SELECT pg_backend_pid()')).toEqual([[pid]]); // the same connection
      expect.soft(await one(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`)).toEqual([['0']]);
    }
    // And the lock is free for everyone else.
    const other = await db.pool.connect();
    try {
      await expect.poll(async () => (await other.query('SELECT pg_try_advisory_lock(424242) AS got')).rows[0].got, { timeout: 5_000 }).toBe(true);
      await other.query('SELECT pg_advisory_unlock(424242)');
    } finally {
      other.release();
    }
  });

  it('forgets session settings made inside a batch (set_config(..., false))', async () => {
    const a = await post({ queries: [{ query: `SELECT set_config('statement_timeout', '999ms', false)`, params: [] }] });
    expect(a.status).toBe(200);
    expect(await one('SHOW statement_timeout')).toEqual([['0']]);
  });

  it('does not leave a transaction open that a single BEGIN started', async () => {
    await one('BEGIN');
    const a = await post({ query: 'SAVEPOINT s' });
    expect(a).toMatchObject({ status: 400, body: { code: '25P01' } });
  });

  it('serves the next request after a failed one', async () => {
    expect((await post({ query: 'SELECT 1/0' })).body).toMatchObject({ code: '22012' });
    expect(await one('SELECT 1')).toEqual([['1']]);
  });
});

describe('size limits', () => {
  it('are the proxy defaults: 10 MiB each way', () => {
    expect(NEON_HTTP_MAX_REQUEST_BYTES).toBe(10 * 1024 * 1024);
    expect(NEON_HTTP_MAX_RESPONSE_BYTES).toBe(10 * 1024 * 1024);
  });

  const bodyOf = (bytes: number) => {
    const head = '{"query":"SELECT length($1)","params":["';
    const tail = '"]}';
    return head + 'x'.repeat(bytes - head.length - tail.length) + tail;
  };

  it('takes a request body of 10 MiB, and refuses one byte more with 413', async () => {
    const at = await post(bodyOf(NEON_HTTP_MAX_REQUEST_BYTES));
    expect(at.status).toBe(200);
    const over = await post(bodyOf(NEON_HTTP_MAX_REQUEST_BYTES + 1));
    expect(over.status).toBe(413);
    expect(over.body).toMatchObject({ message: `request is too large (max is ${NEON_HTTP_MAX_REQUEST_BYTES} bytes)`, code: '' });
  });

  it('refuses a response past 10 MiB with 507, checked before each row as the proxy does', async () => {
    const mib = 1024 * 1024;
    // Ten rows of 1 MiB: the buffer passes the limit only with the tenth, and no row follows.
    expect((await post({ query: `SELECT repeat('x', ${mib}) FROM generate_series(1, 10)` })).status).toBe(200);
    const over = await post({ query: `SELECT repeat('x', ${mib}) FROM generate_series(1, 11)` });
    expect(over.status).toBe(507);
    expect(over.body).toMatchObject({ message: `response is too large (max is ${NEON_HTTP_MAX_RESPONSE_BYTES} bytes)`, code: '' });
  });

  it('counts a batch as one response, and rolls it back when it is too large', async () => {
    const mib = 1024 * 1024;
    const six = { query: `SELECT repeat('x', ${mib}) FROM generate_series(1, 6)`, params: [] };
    const a = await post({ queries: [{ query: `INSERT INTO notes VALUES (3, 'big')`, params: [] }, six, six] });
    expect(a.status).toBe(507);
    expect((await db.pool.query('SELECT count(*)::int AS n FROM notes WHERE id = 3')).rows[0].n).toBe(0);
  });
});

describe('the answer', () => {
  it('carries every error field of the proxy, null where Postgres gave none', async () => {
    const a = await post({ query: `INSERT INTO notes VALUES (NULL, 'x')` });
    expect(a.status).toBe(400);
    expect(Object.keys(a.body).sort()).toEqual(
      ['message', 'code', 'detail', 'hint', 'position', 'internalPosition', 'internalQuery', 'severity', 'where', 'table', 'column', 'schema', 'dataType', 'constraint', 'file', 'line', 'routine'].sort(),
    );
    expect(a.body).toMatchObject({ code: '23502', severity: 'ERROR', table: 'notes', column: 'id', hint: null, position: null });
  });

  it('gives rows as objects unless array mode is asked for', async () => {
    const a = await post({ query: `SELECT 1 AS a, 'b' AS b` }, { 'Neon-Array-Mode': undefined });
    expect(a.body).toMatchObject({ rows: [{ a: '1', b: 'b' }], rowAsArray: false, command: 'SELECT', rowCount: 1 });
    const b = await post({ query: `SELECT 1 AS a`, arrayMode: true }, { 'Neon-Array-Mode': undefined });
    expect(b.body).toMatchObject({ rows: [['1']], rowAsArray: true });
  });
});
