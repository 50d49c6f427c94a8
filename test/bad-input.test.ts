/**
 * Bad input, catalogued: everything a caller or an attacker can send, each
 * with the clear error it gets and the proof that nothing changed (a count
 * and a checksum of every outlive table, and the list of its tables, taken
 * before and after).
 *
 * Not here: CLI cases and dashboard tokens (another engineer's).
 */
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate as drizzleMigrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { batchEnqueue, cancelRun, ConfigError, defineSchedule, defineTask, enqueue, enqueueDue, enqueueMany, explainRun, InvalidEnqueueError, InvalidGraphError, MAX_INPUT_BYTES, PassError, signNudge, SIGNATURE_HEADER, startRun, step, tick, type AnyTask } from '../src/index.js';
import { createWorker, migrate } from '../src/node/index.js';
import { MIGRATIONS_FOLDER } from '../src/node/migrate.js';
import { status } from '../src/admin/queries.js';
import { CLAIM_FUNCTION } from '../src/pass/claim.js';
import { createDrainRoute } from '../src/http/vercel.js';
import type { FunctionsEnv } from '../src/http/invocation.js';
import { closePool, emptyDatabase, freshDb, openPool } from './support/db.js';
import { roleUrl } from './support/functions-db.js';
import { startWsProxy } from './support/ws-proxy.js';

const db = await freshDb();

// SQL-looking strings, sent in every field that takes a string.
const SQL = [`'; DROP TABLE outlive.tasks; --`, `" OR 1=1 --`, `$$; DELETE FROM outlive.runs; $$`, `\\'); TRUNCATE outlive.tasks CASCADE; --`];

const job = defineTask({ name: 'bad.job', input: z.object({ n: z.number().int(), s: z.string().optional() }), queue: 'seeded', run: async ({ n }) => ({ n }) });
const anything = defineTask({ name: 'bad.any', input: z.any(), queue: 'seeded', run: async () => null });
/** A schema with an asynchronous check, which enqueue (synchronous, for db.batch) cannot run. */
const asyncJob = defineTask({ name: 'bad.async', input: z.object({ n: z.number() }).refine(async () => true), queue: 'seeded', run: async ({ n }) => ({ n }) });

// Rows for the checksums to cover: plain tasks, a run with edges, a schedule.
await enqueueMany(db.pool, job, [{ n: 1 }, { n: 2 }, { n: 3 }]);
const seededRun = await startRun(db.pool, 'seeded-run', { a: step(job, { n: 4 }), b: step(job, { n: 5 }, { after: ['a'] }) });
const hourly = defineSchedule({ name: 'bad.hourly', cron: '0 * * * *', task: job, input: { n: 6 } });
await enqueueDue(db.pool, [hourly], { prune: false });

// The drain route as Vercel runs it: the Neon driver through the WebSocket proxy.
const { url: databaseUrl } = await roleUrl(db);
const target = new URL(db.url);
const proxy = await startWsProxy(`${target.hostname}:${target.port || 5432}`);
afterAll(() => proxy.close());
const SECRET = 'a'.repeat(16) + crypto.randomUUID().replace(/-/g, '');
const env: FunctionsEnv = { DATABASE_URL: databaseUrl, NEON_WS_PROXY: proxy.address, OUTLIVE_DRAIN_SECRET: SECRET, OUTLIVE_DRAIN_URL: 'https://app.example/api/drain', CRON_SECRET: `cron-${crypto.randomUUID()}`, OUTLIVE_BUDGET_MS: '20000' };
const POST = createDrainRoute(() => [job], { env, write: (l) => logLines.push(l) });
const logLines: string[] = [];
const DRAIN_BODY = JSON.stringify({ queues: ['drain-only'] });
/** Where the drain requests arrive: the endpoint their signatures are for. */
const DRAIN_URL = 'https://app.example/api/drain';
const drain = async (body: string, signature?: string | null) =>
  POST(
    new Request(DRAIN_URL, {
      method: 'POST',
      headers: signature === null ? {} : { [SIGNATURE_HEADER]: signature ?? (await signNudge(SECRET, DRAIN_URL, body)) },
      body,
    }),
  );
// A signature spent before the snapshot, to replay.
const spent = await signNudge(SECRET, DRAIN_URL, DRAIN_BODY);
const spentResponse = await drain(DRAIN_BODY, spent);
const spentBody = await spentResponse.text();
if (spentResponse.status !== 200) throw new Error(`setup drain: ${spentResponse.status} ${spentBody} ${logLines.join(" ")}`);

const TABLES = ['tasks', 'runs', 'task_deps', 'schedules', 'schedule_slots', 'used_nonces', 'migrations'];

/** Counts and checksums of every outlive table, and the tables there are. */
async function snapshot(pool: pg.Pool) {
  const out: Record<string, string> = {};
  for (const t of TABLES) {
    const { rows } = await pool.query(`SELECT count(*)::int AS n, md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) AS sum FROM outlive.${t} x`);
    out[t] = `${rows[0].n}:${rows[0].sum}`;
  }
  const { rows } = await pool.query(`SELECT string_agg(tablename, ',' ORDER BY tablename) AS t FROM pg_tables WHERE schemaname = 'outlive'`);
  out.tables = rows[0].t;
  return out;
}

const closedPortUrl = 'postgres://postgres@127.0.0.1:1/outlive';
const missingDbUrl = (() => {
  const u = new URL(db.url);
  u.pathname = '/outlive_no_such_database';
  return u.toString();
})();

type ErrorClass = new (...args: never[]) => Error;
interface Case {
  name: string;
  /** Throws: the error's class and message. */
  throws?: [ErrorClass, RegExp];
  /** Answers: the HTTP status and the error in its body. */
  answers?: [number, RegExp];
  act: () => unknown;
}

const longName = 'x'.repeat(201);
const tooBig = { n: 1, s: 'x'.repeat(MAX_INPUT_BYTES) };
const circular: Record<string, unknown> = {};
circular.self = circular;

const cases: Case[] = [
  // Inputs that do not match the schema, or cannot be stored.
  { name: 'input missing a field', throws: [InvalidEnqueueError, /cannot enqueue "bad\.job": input does not match its schema: n: /], act: () => enqueue(db.pool, job, {} as never) },
  { name: 'input of the wrong type', throws: [InvalidEnqueueError, /input does not match its schema: n: .*expected number/i], act: () => enqueue(db.pool, job, { n: 'one' } as never) },
  { name: 'input null', throws: [InvalidEnqueueError, /input does not match its schema: \(input\)/], act: () => enqueue(db.pool, job, null as never) },
  { name: 'input a fraction where a whole number is asked', throws: [InvalidEnqueueError, /n: /], act: () => enqueue(db.pool, job, { n: 1.5 }) },
  { name: 'input over 1 MiB of JSON', throws: [InvalidEnqueueError, /input is (at least )?\d+ bytes of JSON, over the limit of 1048576/], act: () => enqueue(db.pool, job, tooBig) },
  { name: 'input with a BigInt', throws: [InvalidEnqueueError, /input does not serialise to JSON/], act: () => enqueue(db.pool, anything, { n: 10n }) },
  { name: 'input with a cycle', throws: [InvalidEnqueueError, /input does not serialise to JSON/], act: () => enqueue(db.pool, anything, circular) },
  { name: 'input undefined (no JSON at all)', throws: [InvalidEnqueueError, /input does not serialise to JSON \(undefined\)/], act: () => enqueue(db.pool, anything, undefined) },
  { name: 'one bad input among good ones in enqueueMany', throws: [InvalidEnqueueError, /input does not match its schema/], act: () => enqueueMany(db.pool, job, [{ n: 7 }, { n: 'x' } as never, { n: 8 }]) },
  { name: 'enqueueMany given no array', throws: [InvalidEnqueueError, /enqueueMany takes an array of inputs/], act: () => enqueueMany(db.pool, job, { n: 1 } as never) },
  // An asynchronous schema, refused by every synchronous door with the fix.
  ...([
    ['enqueue', () => enqueue(db.pool, asyncJob, { n: 1 })],
    ['enqueueMany', () => enqueueMany(db.pool, asyncJob, [{ n: 1 }, { n: 2 }])],
    ['batchEnqueue', async () => batchEnqueue(drizzle(db.pool), asyncJob, { n: 1 })],
    ['a run\'s step', () => startRun(db.pool, 'async-step', { a: step(job, { n: 1 }), b: step(asyncJob, { n: 2 }) })],
  ] as const).map(([door, act]): Case => ({
    name: `an asynchronous schema, in ${door}`,
    throws: [InvalidEnqueueError, /cannot enqueue "bad\.async": its input schema's validate returned a Promise .*make the schema synchronous and do asynchronous checks in the task's handler/],
    act,
  })),
  { name: 'a schedule of a task with an asynchronous schema', throws: [ConfigError, /schedule "bad\.async": task "bad\.async" cannot be scheduled: its input schema's validate returned a Promise/], act: () => defineSchedule({ name: 'bad.async', cron: '0 * * * *', task: asyncJob, input: { n: 1 } }) },
  // Unknown tasks and bad options.
  { name: 'enqueue of an object that is not a defined task', throws: [InvalidEnqueueError, /enqueue needs a task made by defineTask\(\)/], act: () => enqueue(db.pool, { name: 'bad.job' } as AnyTask, { n: 1 }) },
  { name: 'maxAttempts 0', throws: [InvalidEnqueueError, /maxAttempts must be a whole number from 1 to 1000, got 0/], act: () => enqueue(db.pool, job, { n: 1 }, { maxAttempts: 0 }) },
  { name: 'maxAttempts 1001', throws: [InvalidEnqueueError, /maxAttempts must be a whole number from 1 to 1000, got 1001/], act: () => enqueue(db.pool, job, { n: 1 }, { maxAttempts: 1001 }) },
  { name: 'timeoutMs negative', throws: [InvalidEnqueueError, /timeoutMs/], act: () => enqueue(db.pool, job, { n: 1 }, { timeoutMs: -1 }) },
  { name: 'runAt an invalid Date', throws: [InvalidEnqueueError, /runAt/], act: () => enqueue(db.pool, job, { n: 1 }, { runAt: new Date('not a date') }) },
  { name: 'delayMs NaN', throws: [InvalidEnqueueError, /delayMs/], act: () => enqueue(db.pool, job, { n: 1 }, { delayMs: Number.NaN }) },
  { name: 'priority a fraction', throws: [InvalidEnqueueError, /priority/], act: () => enqueue(db.pool, job, { n: 1 }, { priority: 0.5 }) },
  // Keys, refused alike by every way of enqueueing (batchEnqueue's checks once drifted from enqueue's).
  ...([
    ['empty', '', /key must be a non-empty string of at most 500 characters/],
    ['of 501 characters', 'k'.repeat(501), /key must be a non-empty string of at most 500 characters/],
    ['with a NUL', 'k\u0000', /key must not contain NUL characters or unpaired surrogates/],
    ['with an unpaired surrogate', 'k\ud800', /key must not contain NUL characters or unpaired surrogates/],
  ] as const).flatMap(([what, key, message]): Case[] => [
    { name: `key ${what}, in enqueue`, throws: [InvalidEnqueueError, message], act: () => enqueue(db.pool, job, { n: 1 }, { key }) },
    { name: `key ${what}, in enqueueMany`, throws: [InvalidEnqueueError, message], act: () => enqueueMany(db.pool, job, [{ n: 1 }], { key: () => key }) },
    { name: `key ${what}, in batchEnqueue`, throws: [InvalidEnqueueError, message], act: async () => batchEnqueue(drizzle(db.pool), job, { n: 1 }, { key }) },
  ]),
  ...SQL.map((s): Case => ({ name: `queue name ${JSON.stringify(s)}`, throws: [InvalidEnqueueError, /queue name .* is invalid: use 1-200 characters/], act: () => enqueue(db.pool, job, { n: 1 }, { queue: s }) })),
  // Task definitions.
  ...SQL.map((s): Case => ({ name: `task name ${JSON.stringify(s)}`, throws: [ConfigError, /task name .* is invalid/], act: () => defineTask({ name: s, input: z.object({}), run: async () => null }) })),
  { name: 'task name empty', throws: [ConfigError, /task name "" is invalid/], act: () => defineTask({ name: '', input: z.object({}), run: async () => null }) },
  { name: 'task name of 201 characters', throws: [ConfigError, /task name "x+" is invalid/], act: () => defineTask({ name: longName, input: z.object({}), run: async () => null }) },
  { name: 'task without an input schema', throws: [ConfigError, /needs an input schema/], act: () => defineTask({ name: 'no-schema', input: undefined as never, run: async () => null }) },
  { name: 'task whose input is not a Standard Schema', throws: [ConfigError, /task "not-a-schema" needs an input schema \(it has no `~standard` property\): pass a Standard Schema such as a zod, valibot or ArkType schema as `input`/], act: () => defineTask({ name: 'not-a-schema', input: { safeParse: () => ({ success: true }) } as never, run: async () => null }) },
  { name: 'task whose input is a Standard Schema of another version', throws: [ConfigError, /implements Standard Schema version 2, and outlive reads version 1\): pass a Standard Schema/], act: () => defineTask({ name: 'schema-v2', input: { '~standard': { version: 2, vendor: 'x', validate: (value: unknown) => ({ value }) } } as never, run: async () => null }) },
  { name: 'task timeoutMs 0', throws: [ConfigError, /timeoutMs must be a whole number of milliseconds from 1/], act: () => defineTask({ name: 't0', input: z.object({}), timeoutMs: 0, run: async () => null }) },
  { name: 'two tasks under one name in a pass', throws: [ConfigError, /two tasks are named "bad\.job"/], act: () => tick(db.pool, { tasks: [job, defineTask({ name: 'bad.job', input: z.object({}), run: async () => null })] }) },
  // Graphs.
  { name: 'a run with no steps', throws: [InvalidGraphError, /./], act: () => startRun(db.pool, 'empty', {}) },
  { name: 'a step waiting for a step not in the run', throws: [InvalidGraphError, /step "b" waits for "nowhere", which is not in the run/], act: () => startRun(db.pool, 'dangling', { a: step(job, { n: 1 }), b: step(job, { n: 2 }, { after: ['nowhere'] }) }) },
  { name: 'a cycle', throws: [InvalidGraphError, /dependency cycle: (a -> c -> b -> a|b -> a -> c -> b|c -> b -> a -> c)/], act: () => startRun(db.pool, 'cycle', { a: step(job, { n: 1 }, { after: ['c'] }), b: step(job, { n: 2 }, { after: ['a'] }), c: step(job, { n: 3 }, { after: ['b'] }) }) },
  { name: 'a step waiting for itself', throws: [InvalidGraphError, /step "a" waits for itself/], act: () => startRun(db.pool, 'self', { a: step(job, { n: 1 }, { after: ['a'] }) }) },
  { name: 'a step name with a control character', throws: [InvalidGraphError, /step name .* is invalid: use 1-200 printable characters/], act: () => startRun(db.pool, 'ctl', { 'a\u0000b': step(job, { n: 1 }) }) },
  { name: 'a run name empty', throws: [InvalidGraphError, /run name/], act: () => startRun(db.pool, '', { a: step(job, { n: 1 }) }) },
  { name: 'a step not made with step()', throws: [InvalidGraphError, /must be made with step\(task, input, options\)/], act: () => startRun(db.pool, 'raw', { a: { n: 1 } as never }) },
  { name: 'a step with an invalid input', throws: [InvalidEnqueueError, /input does not match its schema/], act: () => startRun(db.pool, 'bad-step-input', { a: step(job, { n: 1 }), b: step(job, { n: 'two' } as never) }) },
  // Cron expressions.
  { name: 'cron with three fields', throws: [ConfigError, /schedule "bad\.cron": cannot read cron "\* \* \*"/], act: () => defineSchedule({ name: 'bad.cron', cron: '* * *', task: job, input: { n: 1 } }) },
  { name: 'cron minute 61', throws: [ConfigError, /cannot read cron "61 \* \* \* \*"/], act: () => defineSchedule({ name: 'bad.cron', cron: '61 * * * *', task: job, input: { n: 1 } }) },
  { name: 'cron that never fires (30 February)', throws: [ConfigError, /cron "0 0 30 2 \*"/], act: () => defineSchedule({ name: 'bad.cron', cron: '0 0 30 2 *', task: job, input: { n: 1 } }) },
  { name: 'cron of SQL', throws: [ConfigError, /cannot read cron/], act: () => defineSchedule({ name: 'bad.cron', cron: SQL[0]!, task: job, input: { n: 1 } }) },
  { name: 'cron empty', throws: [ConfigError, /needs a cron expression/], act: () => defineSchedule({ name: 'bad.cron', cron: ' ', task: job, input: { n: 1 } }) },
  { name: 'cron in an unknown time zone', throws: [ConfigError, /time zone "Mars\/Olympus_Mons"/], act: () => defineSchedule({ name: 'bad.cron', cron: '0 * * * *', timezone: 'Mars/Olympus_Mons', task: job, input: { n: 1 } }) },
  { name: 'schedule catch-up of 0', throws: [ConfigError, /missed must be 'latest' or \{ catchUp: n \}/], act: () => defineSchedule({ name: 'bad.cron', cron: '0 * * * *', task: job, input: { n: 1 }, missed: { catchUp: 0 } }) },
  { name: 'schedule input not matching its task', throws: [ConfigError, /input does not match the schema of task "bad\.job"/], act: () => defineSchedule({ name: 'bad.cron', cron: '0 * * * *', task: job, input: { n: 'x' } as never }) },
  ...SQL.map((s): Case => ({ name: `schedule name ${JSON.stringify(s)}`, throws: [ConfigError, /schedule name .* is invalid/], act: () => defineSchedule({ name: s, cron: '0 * * * *', task: job, input: { n: 1 } }) })),
  // Pass options.
  { name: 'tick budgetMs 0', throws: [ConfigError, /tick option budgetMs must be a whole number >= 1, got 0/], act: () => tick(db.pool, { tasks: [job], budgetMs: 0 }) },
  { name: 'tick concurrency 1.5', throws: [ConfigError, /tick option concurrency must be a whole number >= 1, got 1\.5/], act: () => tick(db.pool, { tasks: [job], concurrency: 1.5 }) },
  { name: 'tick reserveMs NaN', throws: [ConfigError, /tick option reserveMs must be a whole number >= 0, got NaN/], act: () => tick(db.pool, { tasks: [job], reserveMs: NaN }) },
  { name: 'tick reserveMs -1', throws: [ConfigError, /tick option reserveMs must be a whole number >= 0, got -1/], act: () => tick(db.pool, { tasks: [job], reserveMs: -1 }) },
  { name: 'tick leaseGraceMs as a string', throws: [ConfigError, /tick option leaseGraceMs must be a whole number >= 1, got "5000"/], act: () => tick(db.pool, { tasks: [job], leaseGraceMs: '5000' as never }) },
  { name: 'tick leaseCheckMs 0', throws: [ConfigError, /tick option leaseCheckMs must be a whole number >= 1, got 0/], act: () => tick(db.pool, { tasks: [job], leaseCheckMs: 0 }) },
  { name: 'tick budget shorter than every timeout', throws: [ConfigError, /can claim none of its tasks: the shortest timeoutMs is 15000 ms/], act: () => tick(db.pool, { tasks: [job], budgetMs: 1_000 }) },
  ...SQL.map((s): Case => ({ name: `tick queue ${JSON.stringify(s)}`, throws: [ConfigError, /queue name .* is invalid/], act: () => tick(db.pool, { tasks: [job], queues: [s] }) })),
  { name: 'cancelRun of a run id that is SQL', throws: [Error, /invalid input syntax for type bigint|run id/], act: () => cancelRun(db.pool, SQL[1]!) },
  { name: 'explainRun of a run id that is SQL', throws: [Error, /invalid input syntax for type bigint|run id/], act: () => explainRun(db.pool, SQL[0]!) },
  // Drain webhooks.
  { name: 'drain webhook without a signature', answers: [401, /missing Outlive-Signature header/], act: () => drain(DRAIN_BODY, null) },
  { name: 'drain webhook with a malformed signature', answers: [401, /malformed Outlive-Signature header/], act: () => drain(DRAIN_BODY, 'garbage') },
  { name: 'drain webhook with SQL as its signature', answers: [401, /malformed Outlive-Signature header/], act: () => drain(DRAIN_BODY, SQL[0]!) },
  { name: 'drain webhook signed with another secret', answers: [401, /signature does not match/], act: async () => drain(DRAIN_BODY, await signNudge('b'.repeat(48), DRAIN_URL, DRAIN_BODY)) },
  { name: 'drain webhook whose body was changed after signing', answers: [401, /signature does not match/], act: async () => drain(JSON.stringify({ queues: ['seeded'] }), await signNudge(SECRET, DRAIN_URL, DRAIN_BODY)) },
  { name: 'drain webhook signed 10 minutes ago', answers: [401, /signature timestamp is outside the allowed window/], act: async () => drain(DRAIN_BODY, await signNudge(SECRET, DRAIN_URL, DRAIN_BODY, { now: new Date(Date.now() - 600_000) })) },
  { name: 'drain webhook signed 10 minutes ahead', answers: [401, /signature timestamp is outside the allowed window/], act: async () => drain(DRAIN_BODY, await signNudge(SECRET, DRAIN_URL, DRAIN_BODY, { now: new Date(Date.now() + 600_000) })) },
  { name: 'drain webhook replayed', answers: [403, /signature was already used/], act: () => drain(DRAIN_BODY, spent) },
  { name: 'drain webhook with a 70 kB body', answers: [413, /./], act: async () => drain(JSON.stringify({ queues: ['x'], pad: 'x'.repeat(70_000) })) },
  // Unreachable or wrong databases.
  { name: 'migrate to a closed port', throws: [Error, /ECONNREFUSED/], act: () => migrate(closedPortUrl) },
  { name: 'migrate to a database that does not exist', throws: [Error, /database "outlive_no_such_database" does not exist/], act: () => migrate(missingDbUrl) },
  {
    name: 'tick on a pool to a closed port',
    throws: [PassError, /hit a database error: .*ECONNREFUSED/],
    act: async () => {
      const pool = openPool({ connectionString: closedPortUrl, connectionTimeoutMillis: 2_000 });
      pool.on('error', () => {});
      try {
        return await tick(pool, { tasks: [job], budgetMs: 20_000 });
      } finally {
        await closePool(pool);
      }
    },
  },
  {
    name: 'enqueue on a pool to a database that does not exist',
    throws: [Error, /database "outlive_no_such_database" does not exist/],
    act: async () => {
      const pool = openPool({ connectionString: missingDbUrl });
      pool.on('error', () => {});
      try {
        return await enqueue(pool, job, { n: 1 });
      } finally {
        await closePool(pool);
      }
    },
  },
];

describe(`bad input: ${cases.length} cases, each refused with a clear error and nothing changed`, () => {
  it.each(cases.map((c) => [c.name, c] as const))('%s', async (_name, c) => {
    const before = await snapshot(db.pool);
    if (c.throws) {
      const [type, message] = c.throws;
      let thrown: unknown;
      try {
        await c.act();
      } catch (err) {
        thrown = err;
      }
      expect(thrown, 'it must throw').toBeInstanceOf(type);
      expect((thrown as Error).message).toMatch(message);
    } else {
      const [status, message] = c.answers!;
      const res = (await c.act()) as Response;
      const body = await res.text();
      expect({ status: res.status, body }).toEqual({ status, body: expect.stringMatching(message) });
    }
    expect(await snapshot(db.pool)).toEqual(before);
  });
});

describe('SQL-looking strings where strings are allowed', () => {
  it('are stored verbatim in inputs, keys, run names and step names, and touch nothing else', async () => {
    const before = await snapshot(db.pool);
    const ids: string[] = [];
    for (const s of SQL) {
      const t = await enqueue(db.pool, job, { n: 100, s }, { key: s, queue: 'sql-looking' });
      ids.push(t.id);
    }
    const run = await startRun(db.pool, SQL[2]!, Object.fromEntries(SQL.map((s, i) => [s, step(job, { n: i, s }, { queue: 'sql-looking' })])));
    const stored = await db.rows<{ key: string; s: string }>(`SELECT key, input->>'s' AS s FROM outlive.tasks WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids]);
    expect(stored).toEqual(SQL.map((s) => ({ key: s, s })));
    const steps = await db.rows<{ step: string }>(`SELECT step FROM outlive.tasks WHERE run_id = $1 ORDER BY step`, [run.id]);
    expect(steps.map((r) => r.step)).toEqual([...SQL].sort((a, b) => (Buffer.from(a) < Buffer.from(b) ? -1 : 1)).sort());
    expect((await db.rows<{ name: string }>(`SELECT name FROM outlive.runs WHERE id = $1`, [run.id]))[0]!.name).toBe(SQL[2]);
    // Same key again: deduplicated, not a second row.
    expect((await enqueue(db.pool, job, { n: 100, s: SQL[0] }, { key: SQL[0], queue: 'sql-looking' })).deduplicated).toBe(true);
    const after = await snapshot(db.pool);
    expect(after.tables).toBe(before.tables);
    expect(Number(after.tasks!.split(':')[0])).toBe(Number(before.tasks!.split(':')[0]) + SQL.length * 2);
    expect(Number(after.runs!.split(':')[0])).toBe(Number(before.runs!.split(':')[0]) + 1);
    await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', finished_at = now() WHERE queue = 'sql-looking'`);
  });
});

describe('a row whose task no pass knows', () => {
  // A rolling deploy (a new enqueuer, old functions) or two services on one
  // queue: the pass that cannot run a task must leave it for one that can.
  it('is not claimed: it stays pending with no attempt counted, and the pass goes on with the others', async () => {
    const { rows } = await db.pool.query(
      `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms) VALUES ('ghost.task', 'ghost', '{}', 3, 1000) RETURNING id::text`,
    );
    const good = await enqueue(db.pool, job, { n: 9 }, { queue: 'ghost' });
    const report = await tick(db.pool, { tasks: [job], queues: ['ghost'], budgetMs: 20_000 });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1, failed: 0 });
    const ghost = (await db.rows(`SELECT state::text, attempts, last_error FROM outlive.tasks WHERE id = $1`, [rows[0].id]))[0];
    expect(ghost).toEqual({ state: 'pending', attempts: 0, last_error: null });
    expect((await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [good.id]))[0]).toEqual({ state: 'succeeded' });
    // The operator is told, by name.
    const s = await status(db.pool);
    expect(s.unrunnable).toEqual([{ name: 'ghost.task', ready: 1, why: expect.stringMatching(/^no pass that ran knows task "ghost.task"/) }]);
    // A pass that knows it runs it.
    const ghostTask = defineTask({ name: 'ghost.task', input: z.object({}), run: () => 'finally' });
    expect(await tick(db.pool, { tasks: [job, ghostTask], queues: ['ghost'] })).toMatchObject({ claimed: 1, succeeded: 1 });
    expect((await status(db.pool)).unrunnable).toEqual([]);
  });

  it('explainRun says no pass knows it, and since when, where a run waits on it', async () => {
    const known = defineTask({ name: 'known-step', input: z.object({}), run: () => 1 });
    const later = defineTask({ name: 'new-step', input: z.object({}), run: () => 2 });
    const t0 = new Date(Date.now() + 3_600_000);
    const at = (ms: number) => new Date(t0.getTime() + ms);
    // A pass of an older deploy once knew new-step; the deploys since do not.
    await tick(db.pool, { tasks: [known, later], queues: ['rolling'], now: t0 });
    const run = await startRun(db.pool, 'rolling', {
      a: step(known, {}, { queue: 'rolling' }),
      b: step(later, {}, { queue: 'rolling', after: ['a'] }),
    });
    await tick(db.pool, { tasks: [known], queues: ['rolling'], now: at(10 * 60_000) });
    const explained = await explainRun(db.pool, run.id, { now: at(10 * 60_000) });
    expect(explained!.tasks.map((t) => [t.step, t.state])).toEqual([['a', 'succeeded'], ['b', 'pending']]);
    expect(explained!.tasks[1]!.why).toBe(
      `no pass that ran since ${t0.toISOString()} knows task "new-step" (the last pass ran at ${at(10 * 60_000).toISOString()}): deploy its handler, or cancel it`,
    );
    await tick(db.pool, { tasks: [known, later], queues: ['rolling'], now: at(11 * 60_000) });
    expect((await explainRun(db.pool, run.id))!.state).toBe('succeeded');
  });
});

describe('a row whose timeout no pass that knows it can give', () => {
  // A pass claims only tasks whose timeout fits in what is left of its
  // budget. A task enqueued with a longer timeoutMs than any pass that knows
  // it can give (a cron pass of 30 s, a timeout of 2 minutes) would wait
  // forever while the operator is told it waits its turn.
  it('is not claimed, and status and explainRun say why; a pass with the budget for it is what counts while it runs', async () => {
    const slow = defineTask({ name: 'slow.build', input: z.object({}), run: () => 'built', timeoutMs: 1_000 });
    const t0 = new Date(Date.now() + 7_200_000);
    const at = (ms: number) => new Date(t0.getTime() + ms);
    const long = await enqueue(db.pool, slow, {}, { queue: 'slow', timeoutMs: 120_000 });
    await enqueue(db.pool, slow, {}, { queue: 'slow' });
    // Other tests' rows of other names may be listed too.
    const unrunnable = async () => (await status(db.pool)).unrunnable.filter((u) => u.name === 'slow.build');
    const short = { tasks: [slow], queues: ['slow'], budgetMs: 10_000, reserveMs: 250 };
    expect(await tick(db.pool, { ...short, now: t0 })).toMatchObject({ claimed: 1, succeeded: 1 });
    expect((await db.rows(`SELECT state::text, attempts FROM outlive.tasks WHERE id = $1`, [long.id]))[0]).toEqual({ state: 'pending', attempts: 0 });
    const why =
      'no pass that knows task "slow.build" can claim it: its timeoutMs of 120000 ms is longer than the 9750 ms the longest of their budgets leaves (budgetMs less reserveMs): raise that budget, or enqueue it with a shorter timeoutMs';
    expect((await unrunnable())).toEqual([{ name: 'slow.build', ready: 1, why }]);
    const run = await startRun(db.pool, 'slow-run', { build: step(slow, {}, { queue: 'slow-run', timeoutMs: 120_000 }) });
    await tick(db.pool, { ...short, queues: ['slow-run'], now: at(1_000) });
    expect((await explainRun(db.pool, run.id, { now: at(1_000) }))!.tasks[0]!.why).toBe(why);

    // A worker with the budget for it knows the name (its own queue, so it claims none of these).
    await tick(db.pool, { tasks: [slow], queues: ['elsewhere'], budgetMs: 300_000, now: at(2_000) });
    expect((await unrunnable())).toEqual([]);
    // The short pass saying what it can give does not hide the worker while the worker runs...
    await tick(db.pool, { ...short, queues: ['elsewhere'], now: at(50_000) });
    expect((await unrunnable())).toEqual([]);
    expect((await explainRun(db.pool, run.id, { now: at(50_000) }))!.tasks[0]!.why).toBe('ready: waiting for a pass to claim it');
    // ...but once the worker has not said so for a while, the short pass's word is what is known.
    await tick(db.pool, { ...short, queues: ['elsewhere'], now: at(10 * 60_000) });
    expect((await unrunnable())).toEqual([{ name: 'slow.build', ready: 2, why }]);
    await db.pool.query(`UPDATE outlive.tasks SET state = 'cancelled', finished_at = now() WHERE name = 'slow.build' AND state = 'pending'`);
  });
});

describe('schemas that are missing or old', () => {
  /** A pool on a new empty database, dropped when the test ends. */
  const emptyPool = async () => (await emptyDatabase()).newPool();

  it('a tick against a database without the schema fails with what is missing named, and writes nothing', async () => {
    const pool = await emptyPool();
    const err = await tick(pool, { tasks: [job], budgetMs: 20_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PassError);
    // The claim and recovery run at once; whichever fails first names what is missing.
    expect((err as Error).message).toMatch(/schema "outlive" does not exist|relation "outlive\.(tasks|known_tasks)" does not exist/);
    const enqueueErr = await enqueue(pool, job, { n: 1 }).catch((e: unknown) => e);
    expect((enqueueErr as Error).message).toMatch(/relation "outlive\.tasks" does not exist/);
    expect((await pool.query(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'outlive'`)).rows[0].n).toBe(0);
  });

  it('migrate() brings a database on the first two migrations up to date, keeping its rows', async () => {
    const pool = await emptyPool();
    // The migrations folder as it was at 0001: the same files, a journal cut after two entries.
    const dir = mkdtempSync(path.join(tmpdir(), 'outlive-old-migrations-'));
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    const journalPath = path.join(dir, 'meta/_journal.json');
    const journal = JSON.parse(readFileSync(journalPath, 'utf8'));
    journal.entries = journal.entries.slice(0, 2);
    writeFileSync(journalPath, JSON.stringify(journal));
    const client = await pool.connect();
    try {
      await drizzleMigrate(drizzle(client), { migrationsFolder: dir, migrationsSchema: 'outlive', migrationsTable: 'migrations' });
    } finally {
      client.release();
    }
    await pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) VALUES ('bad.job', '{"n": 42}', 5, 15000)`);
    expect((await pool.query(`SELECT to_regclass('outlive.schedules') AS t`)).rows[0].t).toBeNull();

    await migrate(pool);
    await migrate(pool); // and again: nothing left to do
    expect((await pool.query(`SELECT count(*)::int AS n FROM outlive.migrations`)).rows[0].n).toBe(JSON.parse(readFileSync(path.join(MIGRATIONS_FOLDER, 'meta/_journal.json'), 'utf8')).entries.length);
    expect((await pool.query(`SELECT to_regclass('outlive.schedules') AS s, to_regclass('outlive.used_nonces') AS u`)).rows[0]).toEqual({ s: 'outlive.schedules', u: 'outlive.used_nonces' });
    const report = await tick(pool, { tasks: [job], budgetMs: 20_000 });
    expect(report).toMatchObject({ claimed: 1, succeeded: 1 });
  });

  it('a tick or a worker on a schema from before the claim of governed tasks (migration 0014) says to run migrate(), and claims nothing', async () => {
    const old = await freshDb();
    await old.pool.query(`DROP FUNCTION ${CLAIM_FUNCTION}`);
    const { id } = await enqueue(old.pool, job, { n: 1 });
    const err = await tick(old.pool, { tasks: [job], budgetMs: 20_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PassError);
    expect((err as Error).message).toMatch(/function outlive\.claim_tasks\(.*\) does not exist: the outlive schema is older than this code; run migrate\(\)/);
    const worker = createWorker({ connectionString: old.url, tasks: [job], logger: { info: () => undefined, warn: () => undefined, error: () => undefined } });
    await expect(worker.start()).rejects.toThrow(new ConfigError('outlive: the database has no outlive.claim_tasks function (migration 0014): run migrate() to bring it up to date'));
    expect((await old.pool.query(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [id])).rows[0].state).toBe('pending');
    // Without 0010's table of known names, the pass says the same.
    await old.pool.query('DROP TABLE outlive.known_tasks');
    const err2 = await tick(old.pool, { tasks: [job], budgetMs: 20_000 }).catch((e: unknown) => e);
    expect((err2 as Error).message).toMatch(/does not exist: the outlive schema is older than this code; run migrate\(\)/);
    expect((await old.pool.query(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [id])).rows[0].state).toBe('pending');
  });
});
