/**
 * `npm start`: outlive locally, with no setup. Starts an embedded PostgreSQL
 * (data kept in .data/pg) unless DATABASE_URL is set, applies migrations,
 * signs up a batch of demo users (each enqueuing a welcome email in the same
 * transaction), and drains the work with bounded passes, printing each pass.
 */
import pg from 'pg';
import { migrate, tick } from '../src/index.js';
import { createUsers, sendWelcome, signUp } from '../examples/demo.js';
import { startPostgres } from '../test/support/postgres.js';

const SIGNUPS = Number(process.env.OUTLIVE_DEMO_SIGNUPS ?? 200);

async function main() {
  const server = await startPostgres({ url: process.env.DATABASE_URL, dataDir: '.data/pg', persistent: true });
  console.log(`PostgreSQL: ${server.embedded ? 'embedded, data in .data/pg' : 'DATABASE_URL'}`);
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await pool.end().catch(() => undefined);
    await server.stop();
  };
  process.once('SIGINT', () => void stop().then(() => process.exit(130)));
  process.once('SIGTERM', () => void stop().then(() => process.exit(143)));
  const pool = new pg.Pool({ connectionString: server.url, max: 10 });
  try {
    await migrate(server.url);
    console.log('migrations applied');
    await createUsers(pool);
    for (let i = 0; i < SIGNUPS; i++) {
      const email = i % 50 === 49 ? `user${i}@invalid.example` : `user${i}@example.com`;
      await signUp(pool, email);
    }
    console.log(`signed up ${SIGNUPS} users, each with a welcome email task enqueued in the same transaction`);

    for (let pass = 1; ; pass++) {
      const r = await tick(pool, { tasks: [sendWelcome], budgetMs: 10_000, concurrency: 10 });
      console.log(
        `pass ${pass}: claimed ${r.claimed}, succeeded ${r.succeeded}, retried ${r.retried}, failed ${r.failed}, recovered ${r.recovered} in ${r.durationMs} ms`,
      );
      const { rows } = await pool.query<{ waiting: number }>(
        `SELECT count(*)::int AS waiting FROM outlive.tasks WHERE state IN ('pending', 'running')`,
      );
      if (rows[0]!.waiting === 0) break;
      // Retries back off; wait for the next one to come due, as a cron tick would.
      if (r.claimed === 0) await new Promise((res) => setTimeout(res, 250));
    }
    const { rows } = await pool.query<{ state: string; n: number }>(
      `SELECT state::text, count(*)::int AS n FROM outlive.tasks WHERE name = $1 GROUP BY 1 ORDER BY 1`,
      [sendWelcome.name],
    );
    console.log('welcome emails by state (all runs of the demo so far):');
    for (const r of rows) console.log(`  ${r.state.padEnd(10)} ${r.n}`);
    const failed = await pool.query<{ id: string; last_error: string }>(
      `SELECT id::text, last_error FROM outlive.tasks WHERE name = $1 AND state = 'failed' ORDER BY id DESC LIMIT 3`,
      [sendWelcome.name],
    );
    for (const f of failed.rows) console.log(`  failed for good: task ${f.id}: ${f.last_error}`);
  } finally {
    await stop();
  }
}

main().catch((err) => {
  console.error(`outlive: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
