/**
 * A process for test/connection-loss.test.ts: runs one engine call that
 * checks a client out of its pool (`cancelRun` or `enqueueDue`), which the
 * test makes wait on a row lock and then cuts with pg_terminate_backend.
 * The pool has its 'error' listener, as every app's should. Prints
 * `rejected: <message>` when the call fails as it should, `resolved` if it
 * does not fail, and exits 0; a crash exits non-zero.
 *
 * `node --import tsx connection-loss-child.ts URL cancelRun|enqueueDue RUN_ID`
 */
import pg from 'pg';
import { z } from 'zod';
import { cancelRun, defineSchedule, defineTask, enqueueDue } from '../../src/index.js';

const [url, op, runId] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: url, application_name: 'outlive-connection-loss-child' });
pool.on('error', () => {});
const task = defineTask({ name: 'loss-noop', input: z.object({}), run: async () => null });
const schedule = defineSchedule({ name: 'loss-schedule', cron: '* * * * * *', task, input: {} });
try {
  if (op === 'cancelRun') await cancelRun(pool, runId!);
  else await enqueueDue(pool, [schedule], { prune: false });
  console.log('resolved');
} catch (err) {
  console.log(`rejected: ${(err as Error).message}`);
}
await pool.end().catch(() => {});
