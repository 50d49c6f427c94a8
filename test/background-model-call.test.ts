/**
 * The essay's first example end to end (examples/background-model-call.ts):
 * the Worker in Miniflare on Neon's driver, a stand-in provider on its real
 * rules (test/support/model-provider.ts) calling the Worker's `/signal`
 * back. A callback twice, a callback before the wait exists, and none at all
 * (the poll finds the page) each build the page once, and no pass runs past
 * its budget: each step is one short call.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { afterAll, describe, expect, it } from 'vitest';
import { tick } from '../src/index.js';
import { pageTasks, buildPage, CALLBACK_TIMEOUT_MS, GIVE_UP_AFTER_S, POLL_EVERY_MS } from '../examples/background-model-call.js';
import { WORKERD_BUILD } from '../scripts/local/bundle.js';
import { freshDb } from './support/db.js';
import { roleUrl, waitFor } from './support/functions-db.js';
import { startModelProvider } from './support/model-provider.js';
import { startWorker, workerDatabase } from './support/worker.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const db = await freshDb();
await db.pool.query('CREATE TABLE pages (id text PRIMARY KEY, html text NOT NULL)');
const { url: databaseUrl } = await roleUrl(db);
const database = await workerDatabase('neon', databaseUrl);
const provider = await startModelProvider();
const built = await build({ ...WORKERD_BUILD, entryPoints: [path.join(root, 'examples/background-model-call.worker.ts')] });
const BUDGET_MS = 8_000;
const worker = await startWorker(
  built.outputFiles[0]!.text,
  { ...database.bindings, OUTLIVE_SIGNAL_SECRETS: provider.secret, OUTLIVE_BUDGET_MS: String(BUDGET_MS), MODEL_URL: provider.url, MODEL_API_KEY: provider.apiKey },
  database.options,
);
provider.setWebhookUrl(worker.url('/signal'));
// The app's side: the same tasks, to enqueue and to run the cron's passes here.
const tasks = pageTasks({ url: provider.url, apiKey: provider.apiKey }, async (pageId, html) => {
  await db.pool.query('INSERT INTO pages (id, html) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET html = excluded.html', [pageId, html]);
});

afterAll(async () => {
  await worker.dispose();
  await provider.close();
  await database.close();
});

const stepOf = async (runId: string, step: string) =>
  (await db.rows<{ state: string; output: unknown }>('SELECT state::text, output FROM outlive.tasks WHERE run_id = $1 AND step = $2', [runId, step]))[0];
const runState = async (id: string) => (await db.rows<{ state: string }>('SELECT state::text FROM outlive.runs WHERE id = $1', [id]))[0]!.state;
const page = async (id: string) => (await db.rows<{ html: string }>('SELECT html FROM pages WHERE id = $1', [id]))[0]?.html;

/** The cron's pass: the Worker's own scheduled handler, timed. */
async function cron(): Promise<number> {
  const started = performance.now();
  await worker.scheduled();
  expect(worker.output()).not.toMatch(/pass-failed/);
  return performance.now() - started;
}

describe('examples/background-model-call.ts in the Worker', () => {
  it('builds the page once when the provider calls back twice', async () => {
    provider.plan({ finishAfterMs: 200, deliveries: 2 });
    const delivered = provider.deliveries.length;
    const run = await buildPage(db.pool, tasks, 'p-twice', 'about us');
    expect(await cron()).toBeLessThan(BUDGET_MS);
    await waitFor(async () => (await runState(run.id)) === 'succeeded', 20_000, 'the run to finish after the webhook');
    // The first delivery may finish the run before the second is answered.
    await waitFor(async () => provider.deliveries.length === delivered + 2, 20_000, 'both deliveries to be answered');
    expect(provider.deliveries.slice(delivered)).toEqual([200, 200]);
    expect(await page('p-twice')).toBe('<h1>about us</h1>');
    expect((await stepOf(run.id, 'callback'))!.output).toEqual({ type: 'response.completed' });
    expect((await db.rows('SELECT delivered FROM outlive.signals WHERE key LIKE $1', ['openai:%'])).length).toBe(1);
  });

  it('takes a callback that came before the wait existed', async () => {
    provider.plan({ finishAfterMs: 0, deliveries: 1, beforeReply: true });
    const run = await buildPage(db.pool, tasks, 'p-early', 'pricing');
    // The webhook landed while the start was still running: kept, then taken when the wait began.
    expect(await cron()).toBeLessThan(BUDGET_MS);
    await waitFor(async () => (await runState(run.id)) === 'succeeded', 20_000, 'the run to finish');
    expect(await page('p-early')).toBe('<h1>pricing</h1>');
    const [callback] = await db.rows('SELECT snoozes FROM outlive.tasks WHERE run_id = $1 AND step = $2', [run.id, 'callback']);
    expect(callback).toEqual({ snoozes: 0 }); // never parked: it began with the kept signal
  });

  it('polls with snoozes when no callback comes, and builds the page when the model is done', async () => {
    provider.plan({ finishAfterMs: null, deliveries: 0 });
    const run = await buildPage(db.pool, tasks, 'p-silent', 'blog');
    expect(await cron()).toBeLessThan(BUDGET_MS);
    expect((await stepOf(run.id, 'callback'))!.state).toBe('pending');
    // No webhook within the wait: at its deadline it ends with null, and the store step polls.
    // Time is a parameter: the passes below act at the wait's deadline and at the polls after it.
    const later = (ms: number) => new Date(Date.now() + ms);
    let snoozed = 0;
    for (let i = 0; i < 3; i++) snoozed += (await tick(db.pool, { tasks: tasks.tasks, now: later(CALLBACK_TIMEOUT_MS + i * POLL_EVERY_MS) })).snoozed;
    expect(await stepOf(run.id, 'callback')).toEqual({ state: 'succeeded', output: null });
    expect(snoozed).toBe(3);
    expect((await stepOf(run.id, 'store'))!.state).toBe('pending');
    // The model finishes (its webhook lost): the next poll stores the page.
    const response = [...provider.responses.values()].find((r) => r.input === 'blog')!;
    response.status = 'completed';
    response.output = [{ content: [{ type: 'output_text', text: '<h1>blog</h1>' }] }];
    await tick(db.pool, { tasks: tasks.tasks, now: later(CALLBACK_TIMEOUT_MS + 10 * POLL_EVERY_MS) });
    expect(await runState(run.id)).toBe('succeeded');
    expect(await page('p-silent')).toBe('<h1>blog</h1>');
  });

  it('gives up, failing the run, when the model never finishes', async () => {
    provider.plan({ finishAfterMs: null, deliveries: 0 });
    const run = await buildPage(db.pool, tasks, 'p-never', 'careers');
    expect(await cron()).toBeLessThan(BUDGET_MS);
    const response = [...provider.responses.values()].find((r) => r.input === 'careers')!;
    response.created_at -= GIVE_UP_AFTER_S + 1;
    await tick(db.pool, { tasks: tasks.tasks, now: new Date(Date.now() + CALLBACK_TIMEOUT_MS) });
    expect(await runState(run.id)).toBe('failed');
    const [store] = await db.rows('SELECT state::text, last_error FROM outlive.tasks WHERE run_id = $1 AND step = $2', [run.id, 'store']);
    expect(store).toEqual({ state: 'failed', last_error: `${response.id} did not finish within an hour` });
  });
});
