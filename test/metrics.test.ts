/**
 * The metrics a monitoring system scrapes: right for a seeded database (time
 * is a parameter: rows are backdated, nothing sleeps), served as Prometheus
 * text that a strict reading of the format accepts, only with the
 * dashboard's token, and read through indexes of live rows, never a scan of
 * the history behind them.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { METRICS_STATEMENTS, metricsParams, metricsSnapshot, type MetricsSnapshot } from '../src/admin/metrics.js';
import { escapeLabelValue, PROMETHEUS_CONTENT_TYPE, prometheusText } from '../src/admin/prometheus.js';
import { handleDashboard } from '../src/http/dashboard/index.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
const NOW = new Date('2026-06-01T12:00:00Z');
const at = (seconds: number) => new Date(NOW.getTime() + seconds * 1000);
const TOKEN = 'metrics-dashboard-token-0123456789';

/** Inserts one task row: defaults of a plain pending row, overridden by `cols`. */
async function row(cols: Record<string, unknown>): Promise<string> {
  const all: Record<string, unknown> = { name: 'job', queue: 'default', input: '{}', max_attempts: 3, timeout_ms: 1000, run_at: NOW, ...cols };
  const names = Object.keys(all);
  const { rows } = await db.pool.query(
    `INSERT INTO outlive.tasks (${names.join(', ')}) VALUES (${names.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING id::text`,
    Object.values(all),
  );
  return rows[0].id;
}

/** An edge of a run: `task` waits for `dependsOn`. */
async function edge(task: string, dependsOn: string): Promise<void> {
  await db.pool.query(
    `WITH r AS (INSERT INTO outlive.runs (name) VALUES ('metrics') RETURNING id)
     INSERT INTO outlive.task_deps (run_id, task_id, depends_on) SELECT r.id, $1, $2 FROM r`,
    [task, dependsOn],
  );
}

async function seed(): Promise<void> {
  // Queue a: plain rows.
  for (const s of [-10, -60, -5]) await row({ queue: 'a', run_at: at(s) });
  await row({ queue: 'a', name: '$wait', run_at: at(-1), input: '{"key":"k","timeoutMs":1}' }); // a wait due: ready to be claimed
  for (let i = 0; i < 2; i++) await row({ queue: 'a', run_at: at(3600) });
  await row({ queue: 'a', state: 'running', attempts: 1, started_at: at(-2), run_at: at(-3), lease_owner: 'p', lease_expires_at: at(60) });
  await row({ queue: 'a', name: '$wait', input: '{"key":"k","timeoutMs":1}', run_at: at(3600), wait_key: 'k', wait_until: at(3600), snoozes: 1, max_attempts: 4 });
  await row({ queue: 'a', name: '$wait', input: '{"ms":1}', run_at: at(3600), wait_until: at(3600), snoozes: 1, max_attempts: 4 });
  await row({ queue: 'a', run_at: at(-600), waiting_on: 1 }); // waits on a dependency: in no index of live rows
  // Queue b: governed rows placed, unplaced, scheduled, blocked on a key.
  const limits = JSON.stringify([{ k: 'key1', n: 1 }]);
  await row({ queue: 'b', fair_key: '', limits, vt: 1, run_at: at(-30) });
  await row({ queue: 'b', fair_key: '', limits, run_at: at(-120) });
  await row({ queue: 'b', fair_key: '', limits, run_at: at(90) });
  for (let i = 0; i < 2; i++) await row({ queue: 'b', fair_key: '', limits, vt: 2 + i, blocked_on: 'key1', run_at: at(-400) });
  // Finished within the window (300 s), and before it.
  await row({ queue: 'a', state: 'succeeded', attempts: 1, run_at: at(-100.5), started_at: at(-100), finished_at: at(-99) });
  await row({ queue: 'a', state: 'succeeded', attempts: 1, run_at: at(-51.5), started_at: at(-50), finished_at: at(-47) });
  await row({ queue: 'b', state: 'failed', attempts: 3, max_attempts: 3, fair_key: '', run_at: at(-22.5), started_at: at(-20), finished_at: at(-15) });
  await row({ queue: 'a', state: 'succeeded', attempts: 1, run_at: at(-4000), started_at: at(-4000), finished_at: at(-3990) });
  // A wait its signal ended, and the step after it started 0.25 s later; a
  // wait ended by its deadline, whose next step is left out.
  const signalled = await row({ queue: 'a', name: '$wait', state: 'succeeded', attempts: 1, input: '{"key":"k2","timeoutMs":600000}',
    signal: '{"id":"s1","payload":null}', run_at: at(-200), started_at: at(-200), finished_at: at(-10) });
  await edge(await row({ queue: 'a', state: 'running', attempts: 1, run_at: at(-10), started_at: at(-9.75), lease_owner: 'p', lease_expires_at: at(60) }), signalled);
  const timedOut = await row({ queue: 'a', name: '$wait', state: 'succeeded', attempts: 1, input: '{"ms":1}', run_at: at(-200), started_at: at(-200), finished_at: at(-11) });
  await edge(await row({ queue: 'a', state: 'failed', attempts: 1, run_at: at(-11), started_at: at(-1000), finished_at: at(-2000) }), timedOut);
  // A paused queue with no tasks, and a paused key.
  await db.pool.query(`INSERT INTO outlive.queue_pauses (queue, reason) VALUES ('c', 'maintenance')`);
  await db.pool.query(`INSERT INTO outlive.limits (key, paused_until, paused_by) VALUES ('key1', $1, 'hand'), ('key2', $2, 'hand')`, [at(600), at(-600)]);
}

beforeAll(seed);

describe('the metrics snapshot', () => {
  it('counts each queue by state, its lag, what waits on limits, pauses and the window', async () => {
    const s = await metricsSnapshot(db.pool, { now: NOW });
    expect(s.now).toEqual(NOW);
    const q = Object.fromEntries(s.queues.map((x) => [x.queue, x]));
    expect(Object.keys(q)).toEqual(['a', 'b', 'c']);
    expect(q.a!.depth).toEqual({ ready: 4, scheduled: 2, running: 2, waiting: 2 });
    expect(q.a!.lagSeconds).toBe(60);
    expect(q.a!.blockedOnLimits).toBe(0);
    expect(q.a!.finished).toEqual({ succeeded: 4, failed: 0, cancelled: 0, skipped: 0 });
    expect(q.b!.depth).toEqual({ ready: 2, scheduled: 1, running: 0, waiting: 2 });
    expect(q.b!.blockedOnLimits).toBe(2);
    expect(q.b!.lagSeconds).toBe(120);
    expect(q.b!.finished).toEqual({ succeeded: 0, failed: 1, cancelled: 0, skipped: 0 });
    expect(q.c).toMatchObject({ paused: true, lagSeconds: 0, depth: { ready: 0, scheduled: 0, running: 0, waiting: 0 } });
    expect(q.a!.paused).toBe(false);
    expect(s.keysPaused).toBe(1);
    expect(s.sampled).toBe(false);
    // Attempts of 1, 3 and 5 s, started 0.5, 1.5 and 2.5 s after due; the wait is left out.
    expect(s.attemptSeconds).toEqual({ 0.5: 3, 0.9: expect.closeTo(4.6, 6), 0.99: expect.closeTo(4.96, 6) });
    expect(s.startLatencySeconds[0.5]).toBe(1.5);
    expect(s.signalToResumeSeconds).toEqual({ 0.5: 0.25, 0.9: 0.25, 0.99: 0.25 });
  });

  it('moves with the clock: an hour later the scheduled rows are ready, and the window is empty', async () => {
    const s = await metricsSnapshot(db.pool, { now: at(3601) });
    const a = s.queues.find((x) => x.queue === 'a')!;
    expect(a.depth).toEqual({ ready: 8, scheduled: 0, running: 2, waiting: 0 });
    expect(a.lagSeconds).toBe(3661);
    expect(a.finished.succeeded).toBe(0);
    expect(s.attemptSeconds[0.5]).toBeNull();
    expect(s.signalToResumeSeconds[0.5]).toBeNull();
  });

  it('reads at most sampleCap rows per final state, and says so', async () => {
    const s = await metricsSnapshot(db.pool, { now: NOW, sampleCap: 2 });
    expect(s.queues.find((x) => x.queue === 'a')!.finished.succeeded).toBe(2);
    // The latest two successes are the wait its signal ended and the one at -11 s.
    expect(s.signalToResumeSeconds[0.5]).toBe(0.25);
    expect(s.sampled).toBe(true);
    await expect(metricsSnapshot(db.pool, { windowSeconds: 0 })).rejects.toThrow(/windowSeconds must be above 0/);
  });
});

// A strict reading of the text exposition format 0.0.4: every line a HELP,
// a TYPE, or a sample of the metric last typed; names and label names in
// their grammar; label values with only the three escapes; values numbers.
const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
interface Parsed { type: string; help: string; samples: { labels: Record<string, string>; value: number }[] }

function parsePrometheus(text: string): Map<string, Parsed> {
  expect(text.endsWith('\n')).toBe(true);
  const metrics = new Map<string, Parsed>();
  let current: string | null = null;
  for (const line of text.slice(0, -1).split('\n')) {
    let m = /^# HELP (\S+) (.*)$/.exec(line);
    if (m) {
      expect(m[1]).toMatch(NAME);
      expect(metrics.has(m[1]!), `${m[1]} described twice`).toBe(false);
      expect(m[2]).not.toMatch(/\\[^\\n]/);
      metrics.set(m[1]!, { type: '', help: m[2]!, samples: [] });
      current = m[1]!;
      continue;
    }
    m = /^# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$/.exec(line);
    if (m) {
      expect(m[1]).toBe(current);
      metrics.get(current!)!.type = m[2]!;
      continue;
    }
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    expect(m, `not a line of the format: ${JSON.stringify(line)}`).not.toBeNull();
    expect(m![1]).toBe(current);
    const labels: Record<string, string> = {};
    let rest = m![2] ?? '';
    while (rest !== '') {
      const l = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)/.exec(rest);
      expect(l, `bad labels: ${rest}`).not.toBeNull();
      expect(l![1]).toMatch(LABEL);
      expect(labels[l![1]!]).toBeUndefined();
      labels[l![1]!] = l![2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
      rest = rest.slice(l![0].length);
    }
    const value = m![3]!;
    expect(value).toMatch(/^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)$/);
    metrics.get(current!)!.samples.push({ labels, value: Number(value.replace('Inf', 'Infinity')) });
  }
  return metrics;
}

describe('Prometheus text', () => {
  it('parses strictly; names carry units, _total only on counters, no ids or keys in labels', async () => {
    const parsed = parsePrometheus(prometheusText(await metricsSnapshot(db.pool, { now: NOW })));
    for (const [name, m] of parsed) {
      expect(m.type, name).toBe('gauge');
      expect(name).toMatch(/^outlive_/);
      expect(name.endsWith('_total')).toBe(m.type === 'counter');
      for (const s of m.samples) expect(Object.keys(s.labels).filter((l) => !['queue', 'state', 'quantile'].includes(l))).toEqual([]);
    }
    const depth = parsed.get('outlive_queue_depth')!.samples;
    expect(depth).toContainEqual({ labels: { queue: 'a', state: 'ready' }, value: 4 });
    expect(depth).toContainEqual({ labels: { queue: 'b', state: 'waiting' }, value: 2 });
    expect(parsed.get('outlive_queue_lag_seconds')!.samples).toContainEqual({ labels: { queue: 'b' }, value: 120 });
    expect(parsed.get('outlive_queue_paused')!.samples).toContainEqual({ labels: { queue: 'c' }, value: 1 });
    expect(parsed.get('outlive_limit_blocked_tasks')!.samples).toContainEqual({ labels: { queue: 'b' }, value: 2 });
    expect(parsed.get('outlive_limit_keys_paused')!.samples).toEqual([{ labels: {}, value: 1 }]);
    expect(parsed.get('outlive_recent_finished_tasks')!.samples).toContainEqual({ labels: { queue: 'b', state: 'failed' }, value: 1 });
    expect(parsed.get('outlive_recent_attempt_duration_seconds')!.samples).toContainEqual({ labels: { quantile: '0.5' }, value: 3 });
  });

  it('escapes label values: a queue named with quotes, backslashes and a line feed reads back the same', () => {
    const queue = 'we"ird\\queue\nname';
    expect(escapeLabelValue(queue)).toBe('we\\"ird\\\\queue\\nname');
    const snapshot: MetricsSnapshot = {
      now: NOW, keysPaused: 0, windowSeconds: 300, sampleCap: 10, sampled: false,
      attemptSeconds: { 0.5: null, 0.9: null, 0.99: null }, startLatencySeconds: { 0.5: 0.25, 0.9: 1, 0.99: 2 },
      signalToResumeSeconds: { 0.5: null, 0.9: null, 0.99: null },
      queues: [{ queue, depth: { ready: 1, scheduled: 0, running: 0, waiting: 0 }, blockedOnLimits: 0, lagSeconds: 1.5, paused: false,
        finished: { succeeded: 0, failed: 0, cancelled: 0, skipped: 0 } }],
    };
    const parsed = parsePrometheus(prometheusText(snapshot));
    expect(parsed.get('outlive_queue_lag_seconds')!.samples).toEqual([{ labels: { queue }, value: 1.5 }]);
    expect(parsed.get('outlive_recent_attempt_duration_seconds')!.samples).toEqual([]);
  });
});

describe('GET <dashboard>/metrics', () => {
  const get = (headers: Record<string, string> = {}) =>
    handleDashboard(new Request('https://ops.example/dashboard/metrics', { headers }), db.pool, { token: TOKEN });

  it('answers 401 without the token, and Prometheus text with it as a Bearer token', async () => {
    const refused = await get();
    expect(refused.status).toBe(401);
    expect(await refused.text()).not.toContain('outlive_queue_depth');
    expect((await get({ authorization: 'Bearer not-the-token-at-all-0123456789' })).status).toBe(401);

    const res = await get({ authorization: `Bearer ${TOKEN}` });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe(PROMETHEUS_CONTENT_TYPE);
    const parsed = parsePrometheus(await res.text());
    expect(parsed.get('outlive_queue_depth')!.samples.some((s) => s.labels.queue === 'a')).toBe(true);
  });
});

/** The scans of outlive.tasks in a plan, and the rows each read (returned or filtered out, over its loops). */
function tasksScans(node: Record<string, unknown>, out: { type: string; index: string | null; rows: number }[] = []) {
  if (node['Relation Name'] === 'tasks' || (typeof node['Index Name'] === 'string' && String(node['Index Name']).startsWith('tasks_'))) {
    const loops = Number(node['Actual Loops'] ?? 1);
    const rows = (Number(node['Actual Rows'] ?? 0) + Number(node['Rows Removed by Filter'] ?? 0) + Number(node['Rows Removed by Index Recheck'] ?? 0)) * loops;
    out.push({ type: String(node['Node Type']), index: (node['Index Name'] as string | undefined) ?? null, rows });
  }
  for (const child of (node['Plans'] as Record<string, unknown>[] | undefined) ?? []) tasksScans(child, out);
  return out;
}

/** EXPLAIN ANALYZE of each statement, on a connection of its own; `guarded` as metricsSnapshot plans them. */
async function checkPlans(guarded: boolean): Promise<void> {
  const params = metricsParams({ now: NOW });
  const client = await db.direct.connect();
  try {
    await client.query('BEGIN');
    if (guarded) await client.query(`SELECT pg_catalog.set_config('enable_seqscan', 'off', true), pg_catalog.set_config('jit', 'off', true)`);
    for (const [name, text] of Object.entries(METRICS_STATEMENTS)) {
      const values = params[name as keyof typeof METRICS_STATEMENTS];
      const [{ 'QUERY PLAN': [plan] }] = (await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${text}`, values)).rows;
      const scans = tasksScans(plan.Plan);
      const where = `${name}${guarded ? ' (guarded)' : ''}`;
      if (name === 'pauses') {
        expect(scans).toEqual([]);
        continue;
      }
      expect(scans.length, where).toBeGreaterThan(0);
      for (const s of scans) {
        expect(s.type, `${where}: ${JSON.stringify(s)}`).toMatch(/^(Index Scan|Index Only Scan|Bitmap Index Scan|Bitmap Heap Scan)( Backward)?$/);
        if (s.type !== 'Bitmap Heap Scan') expect(s.index, where).toMatch(/^tasks_((claim|governed|unplaced|blocked|lease|state_finished)_idx|pkey)$/);
      }
      // 21 live rows and 8 finished in or near the window are seeded; the 100,000 are never read.
      const read = scans.filter((s) => s.type !== 'Bitmap Index Scan').reduce((n, s) => n + s.rows, 0);
      expect(read, where).toBeLessThan(100);
    }
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
}

describe('the metrics read live rows by index, not history', () => {
  it('with 100,000 finished rows, each statement scans outlive.tasks by an index only, reading the live rows and the window\'s', async () => {
    await db.pool.query(
      `INSERT INTO outlive.tasks (name, queue, input, max_attempts, timeout_ms, state, attempts, run_at, started_at, finished_at)
       SELECT 'old', 'q' || (i % 5), '{}', 3, 1000, (ARRAY['succeeded', 'failed', 'cancelled', 'skipped'])[1 + i % 4]::outlive.task_state, 1,
              $1::timestamptz - interval '2 days', $1::timestamptz - interval '2 days', $1::timestamptz - interval '1 day' + i * interval '1 ms'
       FROM generate_series(1, 100000) i`,
      [NOW],
    );
    // Before the statistics know of them, as metricsSnapshot plans; then with them, as the planner would anyway.
    await checkPlans(true);
    await db.pool.query(`ANALYZE outlive.tasks`);
    await checkPlans(true);
    await checkPlans(false);
    // The snapshot is unchanged by the history.
    const s = await metricsSnapshot(db.pool, { now: NOW });
    expect(s.queues.map((x) => x.queue)).toEqual(['a', 'b', 'c']);
  });
});
