/**
 * The `outlive` CLI, run as the real binary (`node --import tsx bin/outlive.js`)
 * in a child process against a real database: its output and its exit codes.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { enqueue, startRun, step, tick } from '../src/index.js';
import { grants } from '../src/node/index.js';
import { freshDb } from './support/db.js';
import { explode, fixExplode, greet, tasks } from './fixtures/cli-tasks.js';

const db = await freshDb();
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TASKS = 'test/fixtures/cli-tasks.ts';

/** Runs the binary; resolves with its exit code and output. */
function cli(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const { DATABASE_URL: _drop, ...rest } = process.env;
    const child = spawn(process.execPath, ['--conditions=outlive-source', '--import', 'tsx', 'bin/outlive.js', ...args], { cwd: root, env: { ...rest, ...env } });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += String(c)));
    child.stderr.on('data', (c: Buffer) => (err += String(c)));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out, err }));
  });
}

const url = ['--database-url', db.url];

/** One clear line on stderr, no stack trace. */
function oneLine(err: string): string {
  const lines = err.trim().split('\n');
  expect(lines).toHaveLength(1);
  expect(err).not.toMatch(/^\s+at /m);
  return lines[0]!;
}

// Each call starts node with tsx (1-2 s on a busy machine); a test makes up to a dozen.
describe('outlive CLI', { timeout: 120_000 }, () => {
  it('migrates with progress, and again with nothing left to do', async () => {
    const r = await cli(['migrate', ...url]);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toMatch(/outlive migrate: connecting to 127\.0\.0\.1:\d+\/outlive_t_/);
    expect(r.out).toMatch(/done: 0 applied now, \d+ in all/);
    const j = await cli(['migrate', '--json'], { DATABASE_URL: db.url });
    expect(j.code, j.err).toBe(0);
    expect(JSON.parse(j.out)).toMatchObject({ applied: 0 });
  });

  it('enqueues with input checked by the task schema; bad input is exit 2 with one line', async () => {
    const ok = await cli(['enqueue', 'greet', '{"name":"ada"}', '--tasks', TASKS, ...url, '--json']);
    expect(ok.code, ok.err).toBe(0);
    const task = JSON.parse(ok.out) as { id: string; name: string; state: string };
    expect(task).toMatchObject({ name: 'greet', state: 'pending' });
    expect(await db.rows(`SELECT input FROM outlive.tasks WHERE id = $1`, [task.id])).toEqual([{ input: { name: 'ada' } }]);

    const invalid = await cli(['enqueue', 'greet', '{"name":""}', '--tasks', TASKS, ...url]);
    expect(invalid.code).toBe(2);
    expect(oneLine(invalid.err)).toMatch(/^outlive: invalid input for "greet": name: /);

    const notJson = await cli(['enqueue', 'greet', '{name', '--tasks', TASKS, ...url]);
    expect(notJson.code).toBe(2);
    expect(oneLine(notJson.err)).toMatch(/^outlive: the input is not valid JSON/);

    const unknown = await cli(['enqueue', 'grete', '{}', '--tasks', TASKS, ...url]);
    expect(unknown.code).toBe(2);
    expect(oneLine(unknown.err)).toBe(`outlive: unknown task "grete": ${TASKS} defines "greet", "explode"`);
    expect(await db.rows(`SELECT count(*)::int AS n FROM outlive.tasks`)).toEqual([{ n: 1 }]);
  });

  it('enqueues tasks whose schemas are valibot or ArkType, checked alike; an asynchronous schema is exit 2 with the fix', async () => {
    const tasks = ['--tasks', 'test/fixtures/cli-schema-tasks.ts', ...url, '--json'];
    const before = await db.rows<{ n: number }>(`SELECT count(*)::int AS n FROM outlive.tasks`);
    const valibot = await cli(['enqueue', 'valibot.greet', '{"name":"ada","tags":"a,b"}', ...tasks]);
    expect(valibot.code, valibot.err).toBe(0);
    const arktype = await cli(['enqueue', 'arktype.greet', '{"name":"grace"}', ...tasks]);
    expect(arktype.code, arktype.err).toBe(0);
    const ids = [valibot, arktype].map((r) => (JSON.parse(r.out) as { id: string }).id);
    // The row keeps the input as given; the schema's output is the handler's.
    expect(await db.rows(`SELECT name, input FROM outlive.tasks WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids])).toEqual([
      { name: 'valibot.greet', input: { name: 'ada', tags: 'a,b' } },
      { name: 'arktype.greet', input: { name: 'grace' } },
    ]);

    const badValibot = await cli(['enqueue', 'valibot.greet', '{"name":"","tags":7}', ...tasks]);
    expect(badValibot.code).toBe(2);
    expect(oneLine(badValibot.err)).toBe('outlive: invalid input for "valibot.greet": name: Invalid length: Expected >=1 but received 0; tags: Invalid type: Expected string but received 7');
    const badArkType = await cli(['enqueue', 'arktype.greet', '"grace"', ...tasks]);
    expect(badArkType.code).toBe(2);
    expect(oneLine(badArkType.err)).toMatch(/^outlive: invalid input for "arktype\.greet": \(input\): must be an object/);
    const async = await cli(['enqueue', 'async.greet', '{"name":"ada"}', ...tasks]);
    expect(async.code).toBe(2);
    expect(oneLine(async.err)).toMatch(/^outlive: cannot enqueue "async\.greet": its input schema's validate returned a Promise .*make the schema synchronous/);
    expect(await db.rows(`SELECT count(*)::int AS n FROM outlive.tasks`)).toEqual([{ n: before[0]!.n + 2 }]);
    // The tests after this one count the rows of the zod tasks alone.
    await db.pool.query(`DELETE FROM outlive.tasks WHERE id = ANY($1::bigint[])`, [ids]);
  });

  it('prints the grants of each role as SQL, the same as grants() returns; no role named is exit 2', async () => {
    const r = await cli(['grants', '--app', 'shop_app', '--worker', 'shop_worker', '--dashboard', 'Shop Ops']);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toBe(grants({ app: 'shop_app', worker: 'shop_worker', dashboard: 'Shop Ops' }));
    expect(r.out).toContain('GRANT SELECT, INSERT, UPDATE, DELETE ON outlive.tasks TO "shop_worker";');
    const none = await cli(['grants']);
    expect(none.code).toBe(2);
    expect(oneLine(none.err)).toBe('outlive: name at least one role: --app <role>, --worker <role>, --dashboard <role>');
    const empty = await cli(['grants', '--app', '']);
    expect(empty.code).toBe(2);
    expect(oneLine(empty.err)).toMatch(/^outlive: grants: the app role must be a role's name of 1-63 bytes/);
  });

  it('answers 3 for an unreachable database and 2 for a bad URL or usage, in one line', async () => {
    const down = await cli(['status', '--database-url', 'postgres://postgres@127.0.0.1:1/nothing']);
    expect(down.code).toBe(3);
    expect(oneLine(down.err)).toMatch(/^outlive: cannot reach the database at 127\.0\.0\.1:1\/nothing: .*ECONNREFUSED/);

    const badUrl = await cli(['tasks', '--database-url', 'mysql://localhost/db']);
    expect(badUrl.code).toBe(2);
    expect(oneLine(badUrl.err)).toMatch(/must start with postgres:\/\//);

    const noUrl = await cli(['runs']);
    expect(noUrl.code).toBe(2);
    expect(oneLine(noUrl.err)).toMatch(/no database: pass --database-url/);

    const badState = await cli(['tasks', '--state', 'exploded', ...url]);
    expect(badState.code).toBe(2);
    expect(badState.err).toMatch(/expected a task state: pending, running/);

    const incomplete = await cli(['retry']);
    expect(incomplete.code).toBe(2);
    expect(incomplete.err).toMatch(/Usage: outlive retry/);
  });

  it('shows status, lists and a task with its error history; retries it', async () => {
    const failing = await enqueue(db.pool, explode, { why: 'no disk' });
    await tick(db.pool, { tasks });
    expect(await db.rows(`SELECT state::text FROM outlive.tasks WHERE id = $1`, [failing.id])).toEqual([{ state: 'failed' }]);

    const s = await cli(['status', ...url]);
    expect(s.code, s.err).toBe(0);
    expect(s.out).toMatch(/^tasks: {2}pending 0, running 0, succeeded 1, failed 1, cancelled 0, skipped 0$/m);
    expect(s.out).toMatch(/^failed in the last hour: 1$/m);
    expect(s.out).toMatch(/^default\s+0\s+0\s+1\s+1\s+0\s+0$/m);
    const sj = JSON.parse((await cli(['status', '--json', ...url])).out);
    expect(sj.tasks).toMatchObject({ succeeded: 1, failed: 1 });

    const list = await cli(['tasks', '--state', 'failed', ...url]);
    expect(list.code, list.err).toBe(0);
    const lines = list.out.trim().split('\n');
    expect(lines[0]).toMatch(/^id\s+name\s+queue\s+state\s+attempts\s+run\s+created\s+last error$/);
    expect(lines).toHaveLength(3);
    expect(lines[2]).toMatch(new RegExp(`^${failing.id}\\s+explode\\s+default\\s+failed\\s+1/2\\s+-\\s+\\d+s ago\\s+NonRetriableError: boom: no disk|^${failing.id}\\s+explode\\s+default\\s+failed\\s+1/2\\s+-\\s+\\d+s ago\\s+boom: no disk`));
    const byName = JSON.parse((await cli(['tasks', '--name', 'greet', '--json', ...url])).out) as { name: string }[];
    expect(byName.map((t) => t.name)).toEqual(['greet']);

    const shown = await cli(['task', failing.id, ...url]);
    expect(shown.code, shown.err).toBe(0);
    expect(shown.out).toMatch(new RegExp(`^task ${failing.id} explode: failed$`, 'm'));
    expect(shown.out).toMatch(/^input: {2}\{"why":"no disk"\}$/m);
    expect(shown.out).toMatch(/^errors \(1, oldest first\):\n {2}attempt 1 at \S+: NonRetriableError: boom: no disk$/m);

    const missing = await cli(['task', '999999', ...url]);
    expect(missing.code).toBe(1);
    expect(oneLine(missing.err)).toBe('outlive: no task 999999');

    // Ids no row can have (beyond a bigint) are not found, not a database error.
    const huge = '99999999999999999999';
    for (const [args, said] of [
      [['task', huge], `no task ${huge}`],
      [['run', huge], `no run ${huge}`],
      [['retry', 'task', huge], `task ${huge} was not retried: no task ${huge}`],
      [['retry', 'run', huge], `run ${huge} was not retried: no run ${huge}`],
      [['cancel', 'run', huge], `no run ${huge}`],
    ] as const) {
      const r = await cli([...args, ...url]);
      expect({ args, code: r.code, err: oneLine(r.err) }).toEqual({ args, code: 1, err: `outlive: ${said}` });
    }
    const none = await cli(['tasks', '--run', huge, ...url]);
    expect({ code: none.code, out: none.out.trim() }).toEqual({ code: 0, out: 'no tasks match' });
    expect((await cli(['task', '12x', ...url])).code).toBe(2);

    const retried = await cli(['retry', 'task', failing.id, ...url]);
    expect(retried.code, retried.err).toBe(0);
    expect(retried.out.trim()).toBe(`task ${failing.id} retried: 1 task pending again`);
    const again = await cli(['retry', 'task', failing.id, ...url]);
    expect(again.code).toBe(1);
    expect(oneLine(again.err)).toMatch(/^outlive: task \d+ was not retried: the task is pending/);

    fixExplode();
    await tick(db.pool, { tasks });
    const after = JSON.parse((await cli(['task', failing.id, '--json', ...url])).out);
    expect(after).toMatchObject({ state: 'succeeded', output: { fixed: 'no disk' } });
    expect(after.errors).toHaveLength(1);
  });

  // Rows another role may write: names, queues, keys, errors and lease owners
  // that no enqueue here would take, with a newline (a forged line), ESC and
  // CSI sequences (which clear or retitle a terminal) and a bidi override.
  it('prints what rows hold escaped: no control character or terminal escape reaches the terminal; --json keeps the text', async () => {
    const odd = (label: string) => `${label}\u001b[2J\u009b31m\u202e\nFAKE: ok\u0007`;
    const runId = (await db.rows<{ id: string }>(`INSERT INTO outlive.runs (name, unfinished, error) VALUES ($1, 1, $2) RETURNING id::text`, [odd('run'), odd('run error')]))[0]!.id;
    const failedId = (await db.rows<{ id: string }>(
      `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, state, attempts, key, last_error, errors, finished_at)
       VALUES ($1, $2, '{}', 1, 1000, 'failed', 1, $3, $4, jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'name', $5::text, 'message', $4::text)), now())
       RETURNING id::text`,
      [odd('name'), odd('queue'), odd('key'), odd('error'), odd('ErrorName')],
    ))[0]!.id;
    const runningId = (await db.rows<{ id: string }>(
      `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, state, attempts, lease_owner, lease_expires_at, run_id, step)
       VALUES ($1, 'default', '{}', 1, 1000, 'running', 1, $2, now() + interval '1 minute', $3, $4) RETURNING id::text`,
      [odd('leased'), odd('owner'), runId, odd('step')],
    ))[0]!.id;
    const raw = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e]/;
    for (const args of [['status'], ['tasks'], ['runs'], ['task', failedId], ['task', runningId], ['run', runId]]) {
      const r = await cli([...args, ...url]);
      expect(r.code, r.err).toBe(0);
      expect(r.out, args.join(' ')).not.toMatch(raw);
      expect(r.out, args.join(' ')).not.toMatch(/^FAKE: ok/m);
    }
    const shown = (await cli(['task', failedId, ...url])).out;
    expect(shown).toContain(`task ${failedId} name\\u001b[2J\\u009b31m\\u202e\\nFAKE: ok\\u0007: failed`);
    expect(shown).toContain('  key key\\u001b[2J');
    expect(shown).toMatch(/^ {2}attempt 1 at \S+: ErrorName\\u001b\[2J.*: error\\u001b\[2J\\u009b31m\\u202e\\nFAKE: ok\\u0007$/m);
    expect((await cli(['task', runningId, ...url])).out).toContain('  leased by owner\\u001b[2J\\u009b31m\\u202e\\nFAKE: ok\\u0007 until');
    expect((await cli(['run', runId, ...url])).out.split('\n')[0]).toBe(`run ${runId} "run\\u001b[2J\\u009b31m\\u202e\\nFAKE: ok\\u0007": running, 0 of 1 tasks done`);
    // In a table cell whitespace is a space, as before; the escapes stay escaped.
    expect((await cli(['tasks', '--state', 'failed', ...url])).out).toContain('name\\u001b[2J\\u009b31m\\u202e FAKE: ok\\u0007');
    const json = await cli(['tasks', '--json', ...url]);
    expect(json.out).not.toMatch(raw);
    const listed = JSON.parse(json.out) as { id: string; name: string; lastError: string | null }[];
    expect(listed.find((t) => t.id === failedId)).toMatchObject({ name: odd('name'), lastError: odd('error') });
    await db.pool.query(`DELETE FROM outlive.runs WHERE id = $1`, [runId]);
    await db.pool.query(`DELETE FROM outlive.tasks WHERE id = $1`, [failedId]);
  });

  it('lists tasks newest first by id as a number, across a power of ten', async () => {
    await db.pool.query(`SELECT setval(pg_get_serial_sequence('outlive.tasks', 'id'), greatest(95, (SELECT coalesce(max(id), 0) FROM outlive.tasks)))`);
    const start = Number((await db.rows<{ n: string }>(`SELECT last_value::text AS n FROM outlive.tasks_id_seq`))[0]!.n);
    // Enough rows that their ids gain a digit: 96..105, or the next such span.
    const target = 10 ** String(start + 1).length;
    await db.pool.query(`SELECT setval('outlive.tasks_id_seq', $1)`, [target - 5]);
    await db.pool.query(`INSERT INTO outlive.tasks (name, input, max_attempts, timeout_ms) SELECT 'sorted', '{}', 1, 1000 FROM generate_series(1, 10)`);
    const listed = JSON.parse((await cli(['tasks', '--name', 'sorted', '--limit', '5', '--json', ...url])).out) as { id: string }[];
    expect(listed.map((t) => Number(t.id))).toEqual([5, 4, 3, 2, 1].map((k) => target + k));
    await db.pool.query(`DELETE FROM outlive.tasks WHERE name = 'sorted'`);
  });

  it('shows a run as a tree with why each task waits, lists runs with progress, cancels and retries it', async () => {
    const run = await startRun(db.pool, 'cli pipeline', {
      fetch: step(greet, { name: 'fetch' }),
      parse: step(greet, { name: 'parse' }, { after: ['fetch'] }),
      store: step(greet, { name: 'store' }, { after: ['parse'] }),
      side: step(greet, { name: 'side' }),
    });
    const tree = await cli(['run', run.id, ...url]);
    expect(tree.code, tree.err).toBe(0);
    const lines = tree.out.trim().split('\n');
    expect(lines[0]).toBe(`run ${run.id} "cli pipeline": running, 0 of 4 tasks done`);
    expect(lines.slice(2).map((l) => l.replace(/ #\d+/, ''))).toEqual([
      '├─ fetch [pending] ready: waiting for a pass to claim it',
      '│  └─ parse [pending] waiting for "fetch" to succeed',
      '│     └─ store [pending] waiting for "parse" to succeed',
      '└─ side [pending] ready: waiting for a pass to claim it',
    ]);

    const runs = await cli(['runs', ...url]);
    expect(runs.out).toMatch(new RegExp(`^${run.id}\\s+cli pipeline\\s+running\\s+0/4\\s+0\\s+`, 'm'));

    const cancelled = await cli(['cancel', 'run', run.id, ...url]);
    expect(cancelled.code, cancelled.err).toBe(0);
    expect(cancelled.out.trim()).toBe(`run ${run.id} cancelled: 4 pending and 0 running tasks cancelled`);
    const twice = await cli(['cancel', 'run', run.id, ...url]);
    expect(twice.code).toBe(1);
    expect(oneLine(twice.err)).toBe(`outlive: run ${run.id} was not cancelled: it has already cancelled`);
    expect((await cli(['cancel', 'run', '424242', ...url])).code).toBe(1);

    const listed = JSON.parse((await cli(['runs', '--state', 'cancelled', '--json', ...url])).out);
    expect(listed).toEqual([expect.objectContaining({ id: run.id, state: 'cancelled', done: 4, total: 4 })]);

    const retried = await cli(['retry', 'run', run.id, ...url]);
    expect(retried.code, retried.err).toBe(0);
    expect(retried.out.trim()).toBe(`run ${run.id} retried: 4 tasks pending again`);
    await tick(db.pool, { tasks });
    const done = await cli(['run', run.id, ...url]);
    expect(done.out.split('\n')[0]).toBe(`run ${run.id} "cli pipeline": succeeded, 4 of 4 tasks done`);
    expect(done.out).toMatch(/└─ store #\d+ \[succeeded\] succeeded on attempt 1/);
  });
});
