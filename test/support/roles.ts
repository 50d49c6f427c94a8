/**
 * Real database roles for the tests of a shared database: each one a login
 * role that is not a superuser, named for this process
 * (`outlive_<kind>_<pid>`) so that test files running at once never share
 * one, and dropped with whatever it was granted when the test (or the file)
 * ends.
 */
import pg from 'pg';
import { afterAll, expect, inject, onTestFinished } from 'vitest';

/** A role made for a test. */
export interface TestRole {
  /** The role's name, as `current_user` reports it. */
  name: string;
  /**
   * `url` (a database's direct URL) signed in as this role. Direct, never
   * through the suite's PgBouncer: that one signs every client in as the one
   * user its configuration names.
   */
  urlOn(url: string): string;
}

/** A name as SQL quotes it, whatever it holds. */
export function ident(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * Creates a LOGIN role `outlive_<kind>_<pid>` (then `suffix`, which may hold
 * any character, as another role's chosen name may), NOSUPERUSER, NOCREATEDB,
 * NOCREATEROLE, NOBYPASSRLS. Made at the top level of a file it is dropped
 * after the file; made inside a test, when that test ends.
 */
export async function createRole(kind: string, suffix = ''): Promise<TestRole> {
  const name = `outlive_${kind}_${process.pid}${suffix}`;
  // A password: a server that does not trust local connections (the embedded
  // PostgreSQL asks for one) refuses a login role without one.
  const password = crypto.randomUUID().replace(/-/g, '');
  const admin = new pg.Client({ connectionString: inject('pgUrl') });
  await admin.connect();
  try {
    // Left by a run of this process's pid that was killed.
    await dropRole(admin, name);
    await admin.query(`CREATE ROLE ${ident(name)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS PASSWORD '${password}'`);
  } finally {
    await admin.end();
  }
  const drop = async () => {
    const c = new pg.Client({ connectionString: inject('pgUrl') });
    await c.connect();
    try {
      await dropRole(c, name);
    } finally {
      await c.end();
    }
  };
  if (expect.getState().currentTestName !== undefined) onTestFinished(drop);
  else afterAll(drop);
  return {
    name,
    urlOn(url: string) {
      const u = new URL(url);
      u.username = encodeURIComponent(name);
      u.password = password;
      return u.toString();
    },
  };
}

/**
 * Drops a role: ends its sessions, then in each database where it owns or
 * was granted something (pg_shdepend says which), drops what it owns and its
 * privileges, which DROP ROLE requires first.
 */
async function dropRole(admin: pg.Client, name: string): Promise<void> {
  const { rows: found } = await admin.query<{ oid: number }>(`SELECT oid FROM pg_roles WHERE rolname = $1`, [name]);
  if (found.length === 0) return;
  await admin.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, [name]);
  const { rows: dbs } = await admin.query<{ datname: string }>(
    `SELECT DISTINCT d.datname FROM pg_shdepend s JOIN pg_database d ON d.oid = s.dbid WHERE s.refclassid = 'pg_authid'::regclass AND s.refobjid = $1`,
    [found[0]!.oid],
  );
  for (const { datname } of dbs) {
    const u = new URL(inject('pgUrl'));
    u.pathname = `/${datname}`;
    const c = new pg.Client({ connectionString: u.toString() });
    try {
      await c.connect();
      await c.query(`DROP OWNED BY ${ident(name)} CASCADE`);
    } catch {
      // The database went meanwhile, and the role's privileges in it with it.
    } finally {
      await c.end().catch(() => undefined);
    }
  }
  await admin.query(`DROP ROLE IF EXISTS ${ident(name)}`);
}
