/**
 * A throwaway database for the measurement scripts: created on the server
 * `DATABASE_URL` names, dropped by `drop()`.
 */
import pg from 'pg';

/** A scratch database's URL, and how to drop it. */
export interface ScratchDb {
  url: string;
  drop(): Promise<void>;
}

/** Creates `<prefix>_<pid>` on the server of `DATABASE_URL` (which must be set). */
export async function scratchDatabase(prefix: string): Promise<ScratchDb> {
  const base = process.env.DATABASE_URL;
  if (!base) throw new Error('set DATABASE_URL to a Postgres server to measure on');
  const name = `${prefix}_${process.pid}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const u = new URL(base);
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    drop: async () => {
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
}
