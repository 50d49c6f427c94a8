import pg from 'pg';
import { describe, expect, inject, it } from 'vitest';
import { migrate } from '../src/index.js';

async function emptyDatabase(): Promise<{ url: string; drop: () => Promise<void> }> {
  const admin = new pg.Client({ connectionString: inject('pgUrl') });
  await admin.connect();
  const name = `outlive_t_${process.pid}_mig_${Date.now().toString(36)}`;
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const u = new URL(inject('pgUrl'));
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    drop: async () => {
      const c = new pg.Client({ connectionString: inject('pgUrl') });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}

describe('migrate', () => {
  it('is safe to run twice, and from several processes at once', async () => {
    const { url, drop } = await emptyDatabase();
    try {
      await Promise.all([migrate(url), migrate(url), migrate(url)]);
      await migrate(url);
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      const applied = await c.query('SELECT count(*)::int AS n FROM outlive.migrations');
      const tables = await c.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = 'outlive' ORDER BY 1`);
      await c.end();
      expect(applied.rows[0].n).toBeGreaterThanOrEqual(2);
      expect(tables.rows.map((r) => r.table_name)).toEqual(expect.arrayContaining(['migrations', 'runs', 'task_deps', 'tasks']));
    } finally {
      await drop();
    }
  });

  it('fails with the database’s own message on a URL that does not answer', async () => {
    await expect(migrate('postgres://postgres@127.0.0.1:1/nowhere')).rejects.toThrow(/ECONNREFUSED/);
  });
});
