/**
 * Rows at the scale the dashboard must hold, written straight with SQL (a
 * million tasks in seconds, not through enqueue and passes): plain tasks of
 * a few names and queues, mostly finished, and runs of many steps shaped as
 * a wide fan-in or a long chain. Used by scripts/dashboard-cpu.ts and the
 * dashboard's scale test.
 */
import type pg from 'pg';

/**
 * `n` plain tasks, ids ascending with age, one every 10 ms back from now:
 * 1 in 1,000 failed (with an error naming its row), 1 in 500 pending, 1 in
 * 2,000 running, the rest succeeded; names task-0 … task-9, queues default,
 * imports and mail.
 */
export async function insertTasks(pool: pg.Pool, n: number): Promise<void> {
  await pool.query(
    `INSERT INTO outlive.tasks (name, queue, state, input, attempts, max_attempts, timeout_ms, run_at, created_at, updated_at, started_at, finished_at, last_error, lease_owner, lease_expires_at)
     SELECT 'task-' || (g % 10), (ARRAY['default', 'imports', 'mail'])[1 + g % 3], s.state,
            '{}', CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, 3, 30000, at, at, at,
            CASE WHEN s.state <> 'pending' THEN at END,
            CASE WHEN s.state IN ('succeeded', 'failed') THEN at + interval '5 ms' END,
            CASE WHEN s.state = 'failed' THEN 'Error: upstream said 503 for row ' || g END,
            CASE WHEN s.state = 'running' THEN 'rows-at-scale' END,
            CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END
     FROM pg_catalog.generate_series(1, $1::int) g,
          LATERAL (SELECT now() - (($1::int - g) * interval '10 ms') AS at) t,
          LATERAL (SELECT (CASE WHEN g % 1000 = 0 THEN 'failed' WHEN g % 500 = 1 THEN 'pending' WHEN g % 2000 = 3 THEN 'running' ELSE 'succeeded' END)::outlive.task_state AS state) s`,
    [n],
  );
  // As autovacuum would leave them: visibility known, so counts read the indexes alone.
  await pool.query('VACUUM ANALYZE outlive.tasks');
}

/**
 * A run of `n` steps. `fan-in`: `page:1` … `page:<n-1>` (10 of them failed,
 * the rest succeeded) and `finish` after all of them, skipped; the run
 * failed. `chain`: `step-1` … `step-<n>`, each after the one before; the
 * first half succeeded, the next running, the rest pending. Returns the
 * run's id.
 */
export async function insertRun(pool: pg.Pool, n: number, shape: 'fan-in' | 'chain'): Promise<string> {
  const [run] = (
    await pool.query<{ id: string }>(
      `INSERT INTO outlive.runs (name, state, unfinished, error, finished_at) VALUES ($1, $2, $3, $4, $5) RETURNING id::text`,
      shape === 'fan-in'
        ? [`fan-in of ${n}`, 'failed', 0, 'step page:1 failed', new Date()]
        : [`chain of ${n}`, 'running', n - Math.floor(n / 2), null, null],
    )
  ).rows;
  const id = run!.id;
  const half = Math.floor(n / 2);
  if (shape === 'fan-in') {
    await pool.query(
      `INSERT INTO outlive.tasks (name, state, input, attempts, max_attempts, timeout_ms, run_id, step, run_at, created_at, started_at, finished_at, last_error)
       SELECT 'fetch-page', s.state, '{}', 1, 1, 30000, $1::bigint, 'page:' || g, at, at, at, at + interval '40 ms',
              CASE WHEN s.state = 'failed' THEN 'Error: page ' || g || ' answered 500' END
       FROM pg_catalog.generate_series(1, $2::int - 1) g,
            LATERAL (SELECT now() - interval '10 min' + g * interval '5 ms' AS at) t,
            LATERAL (SELECT (CASE WHEN g % (($2::int / 10) + 1) = 1 THEN 'failed' ELSE 'succeeded' END)::outlive.task_state AS state) s`,
      [id, n],
    );
    await pool.query(
      `INSERT INTO outlive.tasks (name, state, input, max_attempts, timeout_ms, run_id, step, waiting_on, finished_at, last_error)
       VALUES ('finish', 'skipped', '{}', 1, 30000, $1, 'finish', 0, now(), 'not run: page:1 failed')`,
      [id],
    );
    await pool.query(
      `INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
       SELECT $1, f.id, p.id FROM outlive.tasks f, outlive.tasks p
       WHERE f.run_id = $1 AND f.step = 'finish' AND p.run_id = $1 AND p.step <> 'finish'`,
      [id],
    );
  } else {
    await pool.query(
      `INSERT INTO outlive.tasks (name, state, input, attempts, max_attempts, timeout_ms, run_id, step, waiting_on, run_at, created_at, started_at, finished_at, lease_owner, lease_expires_at)
       SELECT 'link', s.state, '{}', CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, 3, 30000, $1::bigint, 'step-' || g,
              CASE WHEN s.state = 'pending' THEN 1 ELSE 0 END, at, at,
              CASE WHEN s.state <> 'pending' THEN at END, CASE WHEN s.state = 'succeeded' THEN at + interval '8 ms' END,
              CASE WHEN s.state = 'running' THEN 'rows-at-scale' END, CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END
       FROM pg_catalog.generate_series(1, $2::int) g,
            LATERAL (SELECT now() - interval '10 min' + g * interval '10 ms' AS at) t,
            LATERAL (SELECT (CASE WHEN g <= $3::int THEN 'succeeded' WHEN g = $3::int + 1 THEN 'running' ELSE 'pending' END)::outlive.task_state AS state) s`,
      [id, n, half],
    );
    await pool.query(
      `INSERT INTO outlive.task_deps (run_id, task_id, depends_on)
       SELECT $1, x.id, x.prev FROM (SELECT id, lag(id) OVER (ORDER BY id) AS prev FROM outlive.tasks WHERE run_id = $1) x WHERE x.prev IS NOT NULL`,
      [id],
    );
  }
  // As autovacuum would leave them: visibility known, so counts read the indexes alone.
  await pool.query('VACUUM ANALYZE outlive.tasks');
  return id;
}
