/**
 * Measures enqueue-to-start latency with the LISTENing worker: a worker runs
 * in a child process (`outlive worker`), this process enqueues one task at a
 * time, and each task returns the moment its handler started. Reports p50,
 * p95 and p99 over the measured tasks, from the COMMIT being sent and from
 * its acknowledgement.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres node --import tsx scripts/worker-latency.ts [count]
 *
 * It creates a scratch database beside DATABASE_URL's and drops it after.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pg from 'pg';
import { z } from 'zod';
import { defineTask, enqueue } from '../src/index.js';
import { migrate } from '../src/node/index.js';
import { scratchDatabase } from './local/scratch-db.js';

/** Returns the wall-clock moment (ms since the epoch, sub-ms) its handler started. */
export const probe = defineTask({
  name: 'latency-probe',
  input: z.object({ i: z.number() }),
  run: () => performance.timeOrigin + performance.now(),
});

export const tasks = [probe];

const wallNow = () => performance.timeOrigin + performance.now();

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

async function main(): Promise<void> {
  const count = Number(process.argv[2] ?? 200);
  const warmup = 20;
  const scratch = await scratchDatabase('outlive_latency');
  const url = scratch.url;
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  const root = fileURLToPath(new URL('..', import.meta.url));
  let child: ReturnType<typeof spawn> | undefined;
  try {
    await migrate(url);
    child = spawn(
      process.execPath,
      ['--conditions=outlive-source', '--import', 'tsx', 'bin/outlive.js', 'worker', '--database-url', url, '--tasks', 'scripts/worker-latency.ts', '--no-retention', '--concurrency', '10'],
      { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve, reject) => {
      child!.once('exit', (code) => reject(new Error(`the worker exited with ${code}`)));
      child!.stdout!.on('data', (d: Buffer) => {
        if (d.toString().includes('outlive worker: started')) resolve();
      });
    });
    const sent: number[] = [];
    const acked: number[] = [];
    const ids: string[] = [];
    const client = await pool.connect();
    for (let i = 0; i < warmup + count; i++) {
      await client.query('BEGIN');
      const row = await enqueue(client, probe, { i });
      const t0 = wallNow();
      await client.query('COMMIT');
      const t1 = wallNow();
      sent.push(t0);
      acked.push(t1);
      ids.push(row.id);
      // Spaced out, so each task meets an idle worker: this measures the wake-up, not a queue.
      await new Promise((r) => setTimeout(r, 25));
    }
    client.release();
    // Wait for the last ones to finish.
    for (;;) {
      const { rows } = await pool.query(`SELECT count(*)::int AS n FROM outlive.tasks WHERE state = 'succeeded'`);
      if (rows[0].n === warmup + count) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const { rows } = await pool.query<{ id: string; output: number }>(`SELECT id::text, output FROM outlive.tasks`);
    const startedAt = new Map(rows.map((r) => [r.id, Number(r.output)]));
    const fromSent: number[] = [];
    const fromAck: number[] = [];
    for (let i = warmup; i < ids.length; i++) {
      const s = startedAt.get(ids[i]!)!;
      fromSent.push(s - sent[i]!);
      fromAck.push(s - acked[i]!);
    }
    const line = (label: string, xs: number[]) => {
      const sorted = [...xs].sort((a, b) => a - b);
      const f = (x: number) => x.toFixed(2);
      console.log(`${label}: p50 ${f(percentile(sorted, 50))} ms, p95 ${f(percentile(sorted, 95))} ms, p99 ${f(percentile(sorted, 99))} ms, max ${f(sorted.at(-1)!)} ms (n=${sorted.length})`);
    };
    line('enqueue-to-start, from COMMIT sent ', fromSent);
    line('enqueue-to-start, from COMMIT acked', fromAck);
  } finally {
    if (child && child.exitCode === null) {
      const exited = new Promise((r) => child!.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    }
    await pool.end();
    await scratch.drop();
  }
}

// This file is also the tasks module the worker child loads; only run as a script.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
