/**
 * A connection cut while the engine holds a client checked out of the pool
 * (inside one of its transactions) must fail that call, not the process.
 *
 * pg-pool removes its own 'error' listener from a client while it is checked
 * out, and a pg Client emits 'error' when its connection ends unexpectedly,
 * even while a query is in flight. Found by the chaos suite (chaos/): worker
 * and tick processes died with "Unhandled 'error' event ... Connection
 * terminated unexpectedly" under pg_terminate_backend, a PostgreSQL restart
 * and a dropped proxy connection.
 *
 * Each case runs the call in a child process (a crash must not take the test
 * runner with it), makes it wait on a row lock held here, then terminates its
 * backend while it waits.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineSchedule, defineTask, enqueueDue, startRun, step } from '../src/index.js';
import { freshDb } from './support/db.js';
import { waitFor } from './support/functions-db.js';

const db = await freshDb();
const child = path.join(path.dirname(fileURLToPath(import.meta.url)), 'support/connection-loss-child.ts');

async function cutWhileWaiting(op: 'cancelRun' | 'enqueueDue', lockSql: string, lockParams: unknown[], runId = '0') {
  const holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
  await holder.query('BEGIN');
  await holder.query(lockSql, lockParams);
  const proc = spawn(process.execPath, ['--conditions=outlive-source', '--import', 'tsx', child, db.url, op, runId], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stdout.on('data', (c: Buffer) => (out += String(c)));
  proc.stderr.on('data', (c: Buffer) => (err += String(c)));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  // The backend the child's statement waits in. Asked directly: through a
  // transaction pooler, a server connection the child used keeps its
  // application_name while it serves others, this test's own queries
  // included, and terminating by name alone once cut the test's own query.
  const waiting = `SELECT pid FROM pg_stat_activity WHERE application_name = 'outlive-connection-loss-child'
                     AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`;
  try {
    // The child's statement waits on the lock held above: its client is checked out.
    await waitFor(async () => (await db.direct.query(waiting)).rows.length > 0, 30_000, `the child's ${op} to wait on the lock`);
    await db.direct.query(`SELECT pg_terminate_backend(pid) FROM (${waiting}) w`);
  } finally {
    await holder.query('ROLLBACK');
    await holder.end();
  }
  const code = await exited;
  return { code, out: out.trim(), err: err.trim().split('\n').slice(0, 4).join('\n') };
}

describe('a connection cut under a checked-out client', () => {
  it('fails cancelRun (executor.ts inTransaction) instead of crashing the process', async () => {
    const t = defineTask({ name: 'loss-step', input: z.object({}), run: async () => null });
    const run = await startRun(db.pool, 'loss-run', { a: step(t, {}) });
    const result = await cutWhileWaiting('cancelRun', `SELECT 1 FROM outlive.tasks WHERE id = $1 FOR UPDATE`, [run.tasks.a], run.id);
    expect(result.err).not.toMatch(/Unhandled 'error' event/);
    expect(result).toMatchObject({ code: 0, out: expect.stringMatching(/^rejected: /) });
  }, 60_000);

  it('fails enqueueDue (schedule.ts inTransaction) instead of crashing the process', async () => {
    const t = defineTask({ name: 'loss-noop', input: z.object({}), run: async () => null });
    const s = defineSchedule({ name: 'loss-schedule', cron: '* * * * * *', task: t, input: {} });
    await enqueueDue(db.pool, [s], { prune: false }); // registers the schedule row
    await new Promise((r) => setTimeout(r, 1_100)); // its first slot comes due (a wait for the clock, not an assertion on time)
    const result = await cutWhileWaiting('enqueueDue', `SELECT 1 FROM outlive.schedules WHERE name = $1 FOR UPDATE`, ['loss-schedule']);
    expect(result.err).not.toMatch(/Unhandled 'error' event/);
    expect(result).toMatchObject({ code: 0, out: expect.stringMatching(/^rejected: /) });
  }, 60_000);
});
