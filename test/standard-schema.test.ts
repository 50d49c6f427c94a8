/**
 * A task's input in any Standard Schema: valibot and ArkType go through
 * every door zod does (enqueue, enqueueMany, enqueueSql, a run's steps,
 * schedules), typed from the schema, refused with their issues in the
 * message, their transforms applied before the handler; an asynchronous
 * schema is refused by the synchronous doors and awaited by the pass; and a
 * Worker on valibot bundles no zod.
 */
import { type } from 'arktype';
import { drizzle } from 'drizzle-orm/node-postgres';
import * as v from 'valibot';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { z } from 'zod';
import {
  batchEnqueue,
  ConfigError,
  defineSchedule,
  defineTask,
  enqueue,
  enqueueDue,
  enqueueMany,
  InvalidEnqueueError,
  startRun,
  step,
  tick,
  type AnyTask,
  type TaskInput,
} from '../src/index.js';
import { enqueueSql } from '../src/write/batch.js';
import { bundleWorkerWith, modulesOf } from '../scripts/bundle-size.js';
import { freshDb } from './support/db.js';

const db = await freshDb();

// The same task in each library: a non-empty name, and tags given as
// "a,b" that the schema turns into ['a', 'b'] before the handler runs.
const viaValibot = defineTask({
  name: 'valibot.tag',
  input: v.object({ name: v.pipe(v.string(), v.minLength(1)), tags: v.pipe(v.string(), v.transform((s) => s.split(','))) }),
  run: ({ name, tags }) => ({ name, tags, count: tags.length }),
});
const viaArkType = defineTask({
  name: 'arktype.tag',
  input: type({ name: 'string > 0', tags: type('string').pipe((s) => s.split(',')) }),
  run: ({ name, tags }) => ({ name, tags, count: tags.length }),
});

const VENDORS = [
  { vendor: 'valibot', task: viaValibot as AnyTask },
  { vendor: 'ArkType', task: viaArkType as AnyTask },
];

const rowsOf = (name: string) =>
  db.rows<{ id: string; state: string; input: unknown; output: unknown; step: string | null }>(
    `SELECT id::text, state::text, input, output, step FROM outlive.tasks WHERE name = $1 ORDER BY id`,
    [name],
  );

/** Ticks until a pass claims nothing. */
async function drain(tasks: AnyTask[]): Promise<void> {
  for (let i = 0; i < 50; i++) if ((await tick(db.pool, { tasks })).claimed === 0) return;
  throw new Error('did not drain');
}

describe('the types of a task with a valibot or ArkType schema', () => {
  it('enqueue takes the schema input type, the handler gets its output type', () => {
    expectTypeOf<TaskInput<typeof viaValibot>>().toEqualTypeOf<{ name: string; tags: string }>();
    expectTypeOf<TaskInput<typeof viaArkType>>().toEqualTypeOf<{ name: string; tags: string }>();
    expectTypeOf<Parameters<typeof viaValibot.run>[0]>().toEqualTypeOf<{ name: string; tags: string[] }>();
    expectTypeOf<Parameters<typeof viaArkType.run>[0]>().toEqualTypeOf<{ name: string; tags: string[] }>();
    // Compiled, never called: tsc checks each line against the schema's types.
    const typed = async () => {
      await enqueue(db.pool, viaValibot, { name: 'a', tags: 'x,y' });
      // @ts-expect-error tags is the string the schema transforms, not its output
      await enqueue(db.pool, viaValibot, { name: 'a', tags: ['x'] });
      // @ts-expect-error name is a string
      await enqueue(db.pool, viaArkType, { name: 1, tags: 'x' });
      // @ts-expect-error a step's input is typed too
      step(viaArkType, { name: 'a' });
      // @ts-expect-error and enqueueSql's
      enqueueSql(viaValibot, { tags: 'x' });
      await enqueueMany(db.pool, viaArkType, [{ name: 'a', tags: 'x' }], { key: (input) => input.name });
    };
    void typed;
  });
});

describe.each(VENDORS)('a task with a $vendor schema', ({ task }) => {
  it('enqueue stores the input as given; a pass hands the handler the schema output', async () => {
    const queued = await enqueue(db.pool, task, { name: 'ada', tags: 'x,y' });
    expect((await rowsOf(task.name)).find((r) => r.id === queued.id)).toMatchObject({ state: 'pending', input: { name: 'ada', tags: 'x,y' } });
    await drain([task]);
    expect((await rowsOf(task.name)).find((r) => r.id === queued.id)).toMatchObject({ state: 'succeeded', output: { name: 'ada', tags: ['x', 'y'], count: 2 } });
  });

  it('refuses an invalid input through every door, with the issues in the message, and writes nothing', async () => {
    const before = await rowsOf(task.name);
    const issue = new RegExp(`^outlive: cannot enqueue "${task.name}": input does not match its schema: name: .+`);
    await expect(enqueue(db.pool, task, { name: '', tags: 'x' })).rejects.toThrow(issue);
    await expect(enqueue(db.pool, task, { name: '', tags: 'x' })).rejects.toBeInstanceOf(InvalidEnqueueError);
    await expect(enqueue(db.pool, task, { name: 'ada', tags: 7 })).rejects.toThrow(/input does not match its schema: tags: .+/);
    // Not an object at all: the issue is about the whole value.
    await expect(enqueue(db.pool, task, null)).rejects.toThrow(/input does not match its schema: \(input\): .+/);
    await expect(enqueueMany(db.pool, task, [{ name: 'a', tags: 'x' }, { name: '', tags: 'x' }])).rejects.toThrow(issue);
    expect(() => enqueueSql(task, { name: '', tags: 'x' })).toThrow(issue);
    expect(() => batchEnqueue(drizzle(db.pool), task, { name: '', tags: 'x' })).toThrow(issue);
    await expect(startRun(db.pool, 'bad-step', { a: step(task, { name: 'a', tags: 'x' }), b: step(task, { name: '', tags: 'x' }) })).rejects.toThrow(issue);
    expect(await rowsOf(task.name)).toEqual(before);
    expect(await db.rows(`SELECT 1 FROM outlive.runs WHERE name = 'bad-step'`)).toEqual([]);
  });

  it('enqueueMany with keys, batchEnqueue through drizzle, and a run\'s steps each run the handler on the schema output', async () => {
    const many = await enqueueMany(db.pool, task, [{ name: 'm1', tags: 'a' }, { name: 'm2', tags: 'a,b' }], { key: (input) => `key-${(input as { name: string }).name}` });
    expect(many.map((t) => t.deduplicated)).toEqual([false, false]);
    const again = await enqueueMany(db.pool, task, [{ name: 'm1', tags: 'other' }], { key: (input) => `key-${(input as { name: string }).name}` });
    expect(again[0]).toMatchObject({ id: many[0]!.id, deduplicated: true });
    // batchEnqueue is drizzle's execute of enqueueSql's statement.
    await batchEnqueue(drizzle(db.pool), task, { name: 'sql', tags: 'p,q,r' });
    const run = await startRun(db.pool, `run-${task.name}`, {
      first: step(task, { name: 'first', tags: 'one' }),
      second: step(task, { name: 'second', tags: 'one,two' }, { after: ['first'] }),
    });
    await drain([task]);
    const outputs = Object.fromEntries((await rowsOf(task.name)).map((r) => [(r.input as { name: string }).name, [r.state, r.output]]));
    expect(outputs).toMatchObject({
      m1: ['succeeded', { tags: ['a'], count: 1 }],
      m2: ['succeeded', { tags: ['a', 'b'], count: 2 }],
      sql: ['succeeded', { tags: ['p', 'q', 'r'], count: 3 }],
      first: ['succeeded', { tags: ['one'] }],
      second: ['succeeded', { tags: ['one', 'two'] }],
    });
    expect(await db.rows(`SELECT state::text FROM outlive.runs WHERE id = $1`, [run.id])).toEqual([{ state: 'succeeded' }]);
  });

  it('schedules: the input is checked when the schedule is defined, and each slot runs the handler on the schema output', async () => {
    const schedule = (input: unknown) => defineSchedule({ name: `every-15-${task.name}`, cron: '*/15 * * * *', task, input: input as never });
    expect(() => schedule({ name: '', tags: 'x' })).toThrow(ConfigError);
    expect(() => schedule({ name: '', tags: 'x' })).toThrow(new RegExp(`schedule "every-15-${task.name}": input does not match the schema of task "${task.name}": name: .+`));
    const fixed = schedule({ name: 'slot', tags: 's,t' });
    const bySlot = defineSchedule({ name: `by-slot-${task.name}`, cron: '*/15 * * * *', task, input: (slot) => ({ name: 'by-slot', tags: slot.toISOString() }) as never });
    await enqueueDue(db.pool, [fixed, bySlot], { now: new Date('2025-01-01T10:07:00Z'), prune: false });
    const fired = await enqueueDue(db.pool, [fixed, bySlot], { now: new Date('2025-01-01T10:15:00Z'), prune: false });
    expect(fired.enqueued).toHaveLength(2);
    await drain([task]);
    const rows = (await rowsOf(task.name)).filter((r) => ['slot', 'by-slot'].includes((r.input as { name: string }).name));
    expect(rows.map((r) => [r.input, r.state, r.output])).toEqual([
      [{ name: 'slot', tags: 's,t' }, 'succeeded', { name: 'slot', tags: ['s', 't'], count: 2 }],
      [{ name: 'by-slot', tags: '2025-01-01T10:15:00.000Z' }, 'succeeded', { name: 'by-slot', tags: ['2025-01-01T10:15:00.000Z'], count: 1 }],
    ]);
  });
});

describe('an asynchronous schema', () => {
  // Each library's async form: a check that reads a "service", and a transform.
  const asyncSchemas = {
    valibot: v.pipeAsync(
      v.object({ n: v.number() }),
      v.checkAsync(async ({ n }) => n >= 0, 'n must not be negative'),
      v.transformAsync(async ({ n }) => ({ n, doubled: n * 2 })),
    ),
    zod: z
      .object({ n: z.number() })
      .refine(async ({ n }) => n >= 0, 'n must not be negative')
      .transform(async ({ n }) => ({ n, doubled: n * 2 })),
  };

  describe.each(Object.entries(asyncSchemas))('in %s', (vendor, schema) => {
    const name = `${vendor}.async`;
    const asyncTask = defineTask({ name, input: schema as typeof asyncSchemas.valibot, run: ({ n, doubled }) => ({ n, doubled }) });
    // The same name with a synchronous schema writes the rows the pass then reads.
    const writer = defineTask({ name, input: z.object({ n: z.number() }), run: () => null });

    it('is refused at enqueue with the fix, writing nothing', async () => {
      const before = await rowsOf(name);
      const fix = new RegExp(`cannot enqueue "${name.replace('.', '\\.')}": its input schema's validate returned a Promise .* make the schema synchronous and do asynchronous checks in the task's handler`);
      await expect(enqueue(db.pool, asyncTask, { n: 1 })).rejects.toThrow(fix);
      await expect(enqueue(db.pool, asyncTask, { n: 1 })).rejects.toBeInstanceOf(InvalidEnqueueError);
      expect(() => enqueueSql(asyncTask, { n: 1 })).toThrow(fix);
      expect(await rowsOf(name)).toEqual(before);
    });

    it('is awaited by the pass: the handler gets its output, and its issues fail the task for good', async () => {
      const good = await enqueue(db.pool, writer, { n: 2 });
      const negative = await enqueue(db.pool, writer, { n: -1 });
      await drain([asyncTask]);
      const rows = await db.rows<{ id: string; state: string; output: unknown; error: { message: string }[] }>(
        `SELECT id::text, state::text, output, errors AS error FROM outlive.tasks WHERE id = ANY($1::bigint[]) ORDER BY id`,
        [[good.id, negative.id]],
      );
      expect(rows[0]).toMatchObject({ state: 'succeeded', output: { n: 2, doubled: 4 } });
      expect(rows[1]).toMatchObject({ state: 'failed' });
      expect(rows[1]!.error.at(-1)!.message).toMatch(new RegExp(`stored input does not match the schema of "${name}": \\(input\\): n must not be negative`));
    });
  });

  it('that throws in the pass fails the attempt, which retries, instead of escaping the pass', async () => {
    const name = 'valibot.unreachable';
    const flaky = defineTask({
      name,
      input: v.pipeAsync(v.object({ n: v.number() }), v.checkAsync(async () => { throw new Error('the lookup service is down'); }, 'never said')),
      retry: { maxAttempts: 3, backoff: () => 60_000 },
      run: () => null,
    });
    const writer = defineTask({ name, input: z.object({ n: z.number() }), run: () => null });
    const queued = await enqueue(db.pool, writer, { n: 1 });
    const report = await tick(db.pool, { tasks: [flaky] });
    expect(report).toMatchObject({ claimed: 1, retried: 1, failed: 0 });
    const [row] = await db.rows<{ state: string; attempts: number; errors: { message: string }[] }>(`SELECT state::text, attempts, errors FROM outlive.tasks WHERE id = $1`, [queued.id]);
    expect(row).toMatchObject({ state: 'pending', attempts: 1 });
    expect(row!.errors.at(-1)!.message).toBe('the lookup service is down');
  });
});

describe('the Worker bundle', () => {
  it('of an app on valibot holds no zod module: nothing in the core pulls zod in', async () => {
    const onZod = await bundleWorkerWith('zod');
    // The check can fail: the same Worker on zod holds zod's modules.
    expect(modulesOf(onZod.metafile, 'zod').length).toBeGreaterThan(0);
    const onValibot = await bundleWorkerWith('valibot');
    expect(modulesOf(onValibot.metafile, 'zod')).toEqual([]);
    expect(modulesOf(onValibot.metafile, 'valibot').length).toBeGreaterThan(0);
    const onArkType = await bundleWorkerWith('arktype');
    expect(modulesOf(onArkType.metafile, 'zod')).toEqual([]);
  });
});
