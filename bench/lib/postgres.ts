/**
 * The orchestrator's view of the server: databases, and the statistics read
 * from outside the database under test (a connection to `postgres`, so that
 * reading them adds nothing to the counts being read).
 */
import pg from 'pg';

/** The server to benchmark: BENCH_DATABASE_URL, or the local PostgreSQL with trust auth. */
export const SERVER_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

/** The connection string of database `name` on the bench server. */
export function urlFor(name: string): string {
  const u = new URL(SERVER_URL);
  u.pathname = `/${name}`;
  return u.toString();
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A connection to the server's `postgres` database for creating databases and reading statistics. */
export class Admin {
  private readonly client: pg.Client;
  // One statement at a time: callers may overlap (templates are prepared side
  // by side, the CPU sampler runs on a timer), and node-postgres deprecates
  // queueing on a busy client.
  private chain: Promise<unknown> = Promise.resolve();

  private constructor(client: pg.Client) {
    this.client = client;
  }

  private query(text: string, params: unknown[] = []): Promise<pg.QueryResult> {
    const next = this.chain.then(() => this.client.query(text, params));
    this.chain = next.catch(() => undefined);
    return next;
  }

  static async connect(): Promise<Admin> {
    const client = new pg.Client({ connectionString: SERVER_URL, application_name: 'bench-admin' });
    await client.connect();
    return new Admin(client);
  }

  async rows<R = Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> {
    return (await this.query(text, params)).rows as R[];
  }

  /** Drops `name` (disconnecting whoever is on it) and creates it afresh, from `template` if given. */
  async recreate(name: string, template?: string): Promise<void> {
    await this.drop(name);
    await this.query(`CREATE DATABASE ${pg.escapeIdentifier(name)}${template ? ` TEMPLATE ${pg.escapeIdentifier(template)}` : ''}`);
  }

  async drop(name: string): Promise<void> {
    await this.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(name)} WITH (FORCE)`);
  }

  /** Databases whose names start with `prefix`. */
  async databases(prefix: string): Promise<string[]> {
    const rows = await this.rows<{ datname: string }>(`SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, [prefix]);
    return rows.map((r) => r.datname);
  }

  /** Transactions committed in database `name` so far, as far as the statistics system knows. */
  async xactCommit(name: string): Promise<number> {
    const [row] = await this.rows<{ n: string }>(`SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = $1`, [name]);
    return Number(row?.n ?? 0);
  }

  /** Server processes connected to database `name`, except `exclude`. */
  async backends(name: string, exclude: readonly number[] = []): Promise<number[]> {
    const rows = await this.rows<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND NOT (pid = ANY($2::int[]))`,
      [name, exclude],
    );
    return rows.map((r) => r.pid);
  }

  /**
   * Waits until nobody is connected to database `name`. A backend flushes
   * its statistics as it exits, before it leaves pg_stat_activity, so after
   * this the commit counter of `name` is complete.
   */
  async waitIdle(name: string, timeoutMs = 30_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while ((await this.backends(name)).length > 0) {
      if (performance.now() > deadline) throw new Error(`bench: database ${name} still has connections after ${timeoutMs} ms`);
      await sleep(20);
    }
  }

  /** The server's version and the settings that shape these numbers. */
  async serverInfo(): Promise<{ version: string; settings: Record<string, string> }> {
    const [v] = await this.rows<{ v: string }>(`SELECT version() AS v`);
    const names = ['shared_buffers', 'synchronous_commit', 'fsync', 'wal_level', 'autovacuum', 'max_connections', 'work_mem', 'max_wal_size'];
    const settings: Record<string, string> = {};
    for (const r of await this.rows<{ name: string; setting: string; unit: string | null }>(
      `SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1)`,
      [names],
    )) {
      settings[r.name] = r.unit === '8kB' ? `${(Number(r.setting) * 8) / 1024} MB` : r.unit === 'MB' ? `${r.setting} MB` : r.setting;
    }
    return { version: v!.v, settings };
  }

  async close(): Promise<void> {
    await this.chain;
    await this.client.end();
  }
}

/**
 * A connection to a database under test, for the orchestrator's own
 * statements (completion polls, checks). Counts its statements, so that its
 * commits can be taken out of the database's commit counter.
 */
export class Probe {
  private readonly client: pg.Client;
  /** Statements sent; each is one transaction (autocommit). */
  statements = 0;
  pid = 0;

  private constructor(client: pg.Client) {
    this.client = client;
  }

  static async connect(name: string): Promise<Probe> {
    const client = new pg.Client({ connectionString: urlFor(name), application_name: 'bench-probe' });
    await client.connect();
    const probe = new Probe(client);
    const [row] = await probe.rows<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    probe.pid = row!.pid;
    return probe;
  }

  async rows<R = Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> {
    this.statements++;
    return (await this.client.query(text, params)).rows as R[];
  }

  async close(): Promise<void> {
    await this.client.end();
  }
}
