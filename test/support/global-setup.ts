/**
 * Vitest global setup: one PostgreSQL for the whole run, and a migrated
 * template database that every test file clones (CREATE DATABASE ... TEMPLATE
 * is much faster than migrating afresh).
 */
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { migrate } from '../../src/node/migrate.js';
import { startPgBouncer, type RunningPooler } from './pgbouncer.js';
import { startPostgres, type RunningPostgres } from './postgres.js';

// Named for this run, so runs sharing one server (a developer's and CI's) never collide.
export const TEMPLATE_DB = `outlive_tpl_${process.pid}`;

let server: RunningPostgres | undefined;
let pooler: RunningPooler | undefined;

export default async function setup(project: TestProject) {
  server = await startPostgres({
    url: process.env.TEST_DATABASE_URL ?? process.env.DATABASE_URL,
    dataDir: `.data/test-pg-${process.pid}`,
  });
  try {
    // TEST_POOLER=pgbouncer: every test database is reached through a real
    // PgBouncer in transaction mode, as through a provider's pooled URL.
    if (process.env.TEST_POOLER === 'pgbouncer') pooler = await startPgBouncer(server.url);
    else if (process.env.TEST_POOLER) throw new Error(`TEST_POOLER=${process.env.TEST_POOLER}: the only pooler the suite runs is pgbouncer`);
    await prepareTemplate(project, server);
  } catch (err) {
    await pooler?.stop();
    await server.stop();
    throw err;
  }
  return async () => {
    await pooler?.stop();
    if (!server) return;
    if (!server.embedded) await dropTemplate(server.url);
    await server.stop();
  };
}

async function prepareTemplate(project: TestProject, server: RunningPostgres) {
  const admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  // Databases left by earlier runs that were killed (their process is gone).
  const stale = await admin.query(`SELECT datname FROM pg_database WHERE datname ~ '^outlive_(tpl|t)_[0-9]+'`);
  for (const { datname } of stale.rows) {
    const pid = Number(/^outlive_(?:tpl|t)_(\d+)/.exec(datname)?.[1]);
    if (!isAlive(pid)) await admin.query(`DROP DATABASE IF EXISTS "${datname}" WITH (FORCE)`);
  }
  await admin.query(`CREATE DATABASE ${TEMPLATE_DB}`);
  await migrate(server.urlFor(TEMPLATE_DB));
  const version = await admin.query('SHOW server_version');
  await admin.end();
  console.log(
    `outlive tests: PostgreSQL ${version.rows[0].server_version} (${server.embedded ? 'embedded' : server.url.replace(/:[^:@/]*@/, ':***@')})` +
      (pooler ? `, through ${pooler.version} in transaction mode` : ''),
  );
  project.provide('pgUrl', server.url);
  project.provide('poolerUrl', pooler ? pooler.pooled(server.url) : '');
  project.provide('templateDb', TEMPLATE_DB);
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function dropTemplate(url: string) {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB} WITH (FORCE)`);
  await admin.end();
}

declare module 'vitest' {
  export interface ProvidedContext {
    pgUrl: string;
    /** The server's URL through the suite's PgBouncer, or '' when the suite runs direct. */
    poolerUrl: string;
    templateDb: string;
  }
}
