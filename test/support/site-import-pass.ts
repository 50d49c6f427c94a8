/**
 * A pass over the site-import tasks in its own process, for the test that
 * kills it in the middle: `node --import tsx site-import-pass.ts DATABASE_URL`.
 */
import pg from 'pg';
import { tick } from '../../src/index.js';
import { siteImportTasks } from '../../examples/site-import.js';

const pool = new pg.Pool({ connectionString: process.argv[2] });
const tasks = siteImportTasks(() => pool);
await tick(pool, { tasks: tasks.all, concurrency: 4, budgetMs: 60_000 });
await pool.end();
