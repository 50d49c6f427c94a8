/**
 * Migrate: bring the `outlive` schema up to date, from the SQL files that
 * drizzle-kit generated into `db/migrations`.
 *
 * The files are applied as drizzle's migrator applies them, into the same
 * table (`outlive.migrations`: a hash and the journal's `when` per file), so
 * a database migrated by earlier releases, which used drizzle's migrator,
 * goes on from where it is. It is done here so that an app need not have
 * drizzle-orm (an optional peer) to migrate.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { checkWhole } from '../model/checks.js';
import { ConfigError } from '../model/errors.js';
import { printable, quoted } from '../model/printable.js';

/** Where the migrations ship, beside the compiled or source tree. */
export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../db/migrations', import.meta.url)).replace(
  /[\\/]dist[\\/]db[\\/]migrations$/,
  '/db/migrations',
);

// Any fixed number works, as long as no other code takes this advisory lock.
// Taken only by the first migrate of a database, when there is no table yet
// to lock: any role that can connect may hold an advisory lock.
export const MIGRATION_LOCK = 0x6f75746c; // "outl"

/** Options of {@link migrate}. */
export interface MigrateOptions {
  /** How long to wait for another migrate's lock before failing with what to do. Default 60 s. */
  lockTimeoutMs?: number;
}

/** What a migrate did. */
export interface MigrateReport {
  /** The migrations this call applied (their files' tags, e.g. `0012_pass_budgets`), oldest first. */
  applied: string[];
  /** How many migrations the database has recorded now. */
  total: number;
}

/** Postgres's error code when a lock was not granted within lock_timeout. */
const LOCK_NOT_AVAILABLE = '55P03';

/**
 * Applies every migration not yet applied, in one transaction. Safe to run
 * twice and from several processes at once: the transaction locks
 * `outlive.migrations` (SHARE ROW EXCLUSIVE, which only a role that may write
 * that table can take), so the second migrate waits for the first, then finds
 * nothing left to do; the very first migrate of a database, with no table to
 * lock yet, takes an advisory lock instead. Both locks end with the
 * transaction, so neither can outlive its migrate through a transaction
 * pooler. A lock not granted within `lockTimeoutMs` fails the migrate naming
 * the session that holds it.
 *
 * In a database other roles share, migrate refuses (and names the fix) a
 * schema `outlive` it did not make or that is not wholly its own: owned by
 * another role, holding an object, trigger or rule another role made, or open
 * to another role's CREATE. It checks before it reads or writes anything in
 * the schema, so nothing planted there runs as the role that migrates; its
 * names bind to `pg_catalog` whatever that role's search_path
 * (docs/shared-database.md).
 *
 * Takes a connection string or a pg Client/Pool (Node only; run it from a
 * deploy step or the CLI, not from a Worker).
 */
export async function migrate(target: string | pg.Pool | pg.Client, options: MigrateOptions = {}): Promise<MigrateReport> {
  const lockTimeoutMs = options.lockTimeoutMs ?? 60_000;
  checkWhole('migrate option lockTimeoutMs', lockTimeoutMs, { min: 1 });
  const migrations = readMigrations(MIGRATIONS_FOLDER);
  const client =
    typeof target === 'string'
      ? new pg.Client({ connectionString: target })
      : target instanceof pg.Pool
        ? await target.connect()
        : target;
  if (typeof target === 'string') await (client as pg.Client).connect();
  // A connection that ends mid-migration fails the query in flight; without a
  // listener the client's 'error' event would also crash the process.
  let lost: Error | undefined;
  const onError = (err: Error) => (lost ??= err);
  client.on('error', onError);
  try {
    await client.query('BEGIN');
    try {
      // First of all: every name in this transaction, the migration files'
      // defaults, CHECKs and index predicates included, binds to pg_catalog,
      // never to a function or operator of a schema on the migrating role's
      // path. pg_temp last, or it would be searched first for relations.
      await client.query('SET LOCAL search_path = pg_catalog, pg_temp');
      await client.query(`SET LOCAL lock_timeout = ${Math.floor(lockTimeoutMs)}`);
      const fresh = await lockSchema(client, migrations, lockTimeoutMs);
      await client.query('SET LOCAL lock_timeout = 0');
      const report = await applyMigrations(client, migrations, fresh);
      // What the migrations made is checked too: default privileges, say, may
      // have opened the new schema to another role's CREATE.
      await inspectSchema(client, migrations);
      await client.query('COMMIT');
      return report;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
  } finally {
    client.off('error', onError);
    if (typeof target === 'string') await (client as pg.Client).end().catch(() => undefined);
    else if (target instanceof pg.Pool) (client as pg.PoolClient).release(lost);
  }
}

type Queryable = pg.Client | pg.PoolClient;

/**
 * Checks schema outlive and takes the migration lock; true when there is no
 * schema yet (this migrate makes it, under the advisory lock). With a schema
 * there, its table `outlive.migrations` is locked, and only after the checks
 * say it is an ordinary table of the migrating role's; they run again under
 * the lock, since another migrate may have changed the schema meanwhile.
 */
async function lockSchema(client: Queryable, migrations: readonly Migration[], lockTimeoutMs: number): Promise<boolean> {
  if (!(await inspectSchema(client, migrations))) {
    await takeLock(client, 'advisory', lockTimeoutMs);
    // Another migrate may have made the schema while this one waited.
    if (!(await inspectSchema(client, migrations))) return true;
  }
  await takeLock(client, 'table', lockTimeoutMs);
  await inspectSchema(client, migrations);
  return false;
}

const LOCKS = {
  advisory: { sql: 'SELECT pg_catalog.pg_advisory_xact_lock($1)', params: [MIGRATION_LOCK] },
  table: { sql: 'LOCK TABLE "outlive"."migrations" IN SHARE ROW EXCLUSIVE MODE', params: [] },
} as const;

/** Takes one of the migration locks, or fails naming who holds it. */
async function takeLock(client: Queryable, kind: keyof typeof LOCKS, lockTimeoutMs: number): Promise<void> {
  // A savepoint, so that a lock not granted leaves the transaction usable for
  // asking who holds it, on this same connection (through a transaction
  // pooler, the only one this migrate has).
  await client.query('SAVEPOINT outlive_lock');
  try {
    await client.query(LOCKS[kind].sql, [...LOCKS[kind].params]);
  } catch (err) {
    if ((err as { code?: string }).code !== LOCK_NOT_AVAILABLE) throw err;
    await client.query('ROLLBACK TO SAVEPOINT outlive_lock');
    throw new Error(await lockHeldMessage(client, kind, lockTimeoutMs), { cause: err });
  }
  await client.query('RELEASE SAVEPOINT outlive_lock');
}

const HOLDERS_SQL = {
  advisory: `
SELECT l.pid, a.usename::text AS role, a.application_name
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted AND l.objid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
  AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
ORDER BY l.pid`,
  table: `
SELECT l.pid, a.usename::text AS role, a.application_name
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.granted AND l.mode OPERATOR(pg_catalog.<>) 'AccessShareLock'
  AND l.relation OPERATOR(pg_catalog.=) 'outlive.migrations'::pg_catalog.regclass AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
ORDER BY l.pid`,
} as const;

/**
 * What to say when the migration lock is held elsewhere, naming who holds it
 * where the server can tell. The holder's role and application_name are its
 * own choice, so they are quoted and escaped.
 */
async function lockHeldMessage(client: Queryable, kind: keyof typeof LOCKS, lockTimeoutMs: number): Promise<string> {
  let holders = '';
  try {
    const { rows } = await client.query<{ pid: number; role: string | null; application_name: string | null }>(
      HOLDERS_SQL[kind],
      kind === 'advisory' ? [MIGRATION_LOCK] : [],
    );
    holders = rows
      .map((r) => [`pid ${r.pid}`, r.role ? `role ${quoted(r.role)}` : '', r.application_name ? `application_name ${quoted(r.application_name)}` : ''].filter(Boolean).join(', '))
      .join('; ');
  } catch {
    // The message stands without the holder's name.
  }
  return (
    `outlive: migrate could not take the migration lock within ${lockTimeoutMs} ms: ` +
    `another migrate is running, or a session holds the lock${holders ? ` (${holders})` : ''}. ` +
    'Wait for that migrate, or end the session holding it (SELECT pg_terminate_backend(pid)); a session lock left by an earlier ' +
    'release of outlive through a transaction pooler stays held until its server connection closes. Run migrate on a direct connection string.'
  );
}

// --- what migrate checks before it touches schema outlive --------------------
//
// Only catalogs are read here, never a relation of the schema: a SELECT on a
// planted view, or an INSERT firing a planted trigger, would run another
// role's code as the migrating role. Roles are compared by identity, not by
// membership: before PostgreSQL 16 any role may grant membership in itself,
// so "the migrating role is a member of the owner" proves nothing.

const SCHEMA_SQL = `
SELECT n.nspowner OPERATOR(pg_catalog.=) me.oid AS ours, pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(n.nspowner)) AS owner_sql,
       pg_catalog.pg_get_userbyid(n.nspowner)::text AS owner, me.rolname::text AS me, pg_catalog.quote_ident(me.rolname) AS me_sql,
       (SELECT c.relkind::text FROM pg_catalog.pg_class c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) n.oid AND c.relname OPERATOR(pg_catalog.=) 'migrations') AS migrations
FROM pg_catalog.pg_roles me LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) 'outlive'
WHERE me.rolname OPERATOR(pg_catalog.=) CURRENT_USER`;

// Every object of the schema that has an owner of its own (an index, a
// table's row type, an array type go with their table or element type).
const FOREIGN_OWNED_SQL = `
WITH ns AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) 'outlive'),
me AS (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER),
objects (classid, objid, owner) AS (
  SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid, c.relowner FROM pg_catalog.pg_class c, ns
  WHERE c.relnamespace OPERATOR(pg_catalog.=) ns.oid AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p', 'v', 'm', 'S', 'f', 'c']::pg_catalog."char"[])
  UNION ALL SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner FROM pg_catalog.pg_proc p, ns WHERE p.pronamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner FROM pg_catalog.pg_type t, ns
  WHERE t.typnamespace OPERATOR(pg_catalog.=) ns.oid AND t.typrelid OPERATOR(pg_catalog.=) 0
    AND NOT EXISTS (SELECT FROM pg_catalog.pg_type e WHERE e.typarray OPERATOR(pg_catalog.=) t.oid)
  UNION ALL SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, o.oprowner FROM pg_catalog.pg_operator o, ns WHERE o.oprnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, o.oid, o.opcowner FROM pg_catalog.pg_opclass o, ns WHERE o.opcnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, o.oid, o.opfowner FROM pg_catalog.pg_opfamily o, ns WHERE o.opfnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, o.oid, o.collowner FROM pg_catalog.pg_collation o, ns WHERE o.collnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, o.oid, o.conowner FROM pg_catalog.pg_conversion o, ns WHERE o.connamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, o.oid, o.cfgowner FROM pg_catalog.pg_ts_config o, ns WHERE o.cfgnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, o.oid, o.dictowner FROM pg_catalog.pg_ts_dict o, ns WHERE o.dictnamespace OPERATOR(pg_catalog.=) ns.oid
  UNION ALL SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, o.oid, o.stxowner FROM pg_catalog.pg_statistic_ext o, ns WHERE o.stxnamespace OPERATOR(pg_catalog.=) ns.oid
)
SELECT i.type, i.identity, pg_catalog.pg_get_userbyid(o.owner)::text AS owner
FROM objects o, me, pg_catalog.pg_identify_object(o.classid, o.objid, 0) i
WHERE o.owner OPERATOR(pg_catalog.<>) me.oid
ORDER BY 1, 2`;

// Who else may CREATE in the schema (grantee 0 is PUBLIC), TRIGGER on one of
// its tables, or write outlive.migrations.
const FOREIGN_PRIVILEGES_SQL = `
SELECT NULL::text AS tbl, a.privilege_type::text AS privilege, a.grantee OPERATOR(pg_catalog.=) 0 AS public,
       pg_catalog.pg_get_userbyid(a.grantee)::text AS role, pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS role_sql
FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive' AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE' AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
UNION ALL
SELECT c.relname::text, a.privilege_type::text, a.grantee OPERATOR(pg_catalog.=) 0,
       pg_catalog.pg_get_userbyid(a.grantee)::text, pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace, pg_catalog.aclexplode(c.relacl) a
WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive' AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
  AND (a.privilege_type OPERATOR(pg_catalog.=) 'TRIGGER'
       OR (c.relname OPERATOR(pg_catalog.=) 'migrations' AND a.privilege_type OPERATOR(pg_catalog.<>) 'SELECT'))
ORDER BY 1 NULLS FIRST, 4, 2`;

// Triggers, rules and policies on the schema's relations: code that runs as
// whoever touches the table (a migration's UPDATE among them).
const HOOKS_SQL = `
SELECT 'trigger' AS kind, t.tgname::text AS name, c.relname::text AS tbl, pg_catalog.quote_ident(t.tgname) AS name_sql,
       pg_catalog.quote_ident(c.relname) AS tbl_sql, t.tgfoid::pg_catalog.regprocedure::text AS calls,
       f.pronamespace OPERATOR(pg_catalog.=) n.oid AS calls_ours
FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) t.tgfoid
WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive' AND NOT t.tgisinternal
UNION ALL
SELECT 'rule', r.rulename::text, c.relname::text, pg_catalog.quote_ident(r.rulename), pg_catalog.quote_ident(c.relname), NULL, NULL
FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) r.ev_class
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive' AND r.rulename OPERATOR(pg_catalog.<>) '_RETURN'
UNION ALL
SELECT 'policy', p.polname::text, c.relname::text, pg_catalog.quote_ident(p.polname), pg_catalog.quote_ident(c.relname), NULL, NULL
FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.polrelid
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive'
ORDER BY 3, 1, 2`;

/** How many of a kind of problem a message lists before it says how many more. */
const LISTED = 10;

/**
 * Checks schema outlive from the catalogs alone: false when it does not
 * exist; true when it is wholly the migrating role's and holds only what
 * outlive's migrations make; otherwise throws a {@link ConfigError} that
 * names each problem and its fix.
 */
async function inspectSchema(client: Queryable, migrations: readonly Migration[]): Promise<boolean> {
  const [schema] = (await client.query<{ ours: boolean | null; owner: string | null; owner_sql: string | null; me: string; me_sql: string; migrations: string | null }>(SCHEMA_SQL)).rows;
  if (!schema || schema.ours === null) return false;
  const me = schema.me_sql;
  const problems: string[] = [];
  const owners = new Set<string>();
  if (!schema.ours) {
    owners.add(schema.owner!);
    problems.push(`schema outlive is owned by role ${quoted(schema.owner!)}, not by ${quoted(schema.me)}, the role running migrate: ALTER SCHEMA outlive OWNER TO ${me}`);
  }
  if (schema.migrations !== 'r') {
    const what = schema.migrations === null ? 'holds no outlive.migrations table' : 'holds an outlive.migrations that is not a table';
    problems.push(`it exists but ${what}, so migrate did not make it (it makes both in one transaction): find out who did, then DROP SCHEMA outlive`);
  }
  const foreign = (await client.query<{ type: string; identity: string; owner: string }>(FOREIGN_OWNED_SQL)).rows;
  for (const o of foreign) owners.add(o.owner);
  problems.push(
    ...listed(foreign, 'objects owned by other roles', (o) =>
      `${o.type} ${o.identity} is owned by role ${quoted(o.owner)}: ALTER ${alterKeyword(o.type)} ${o.identity} OWNER TO ${me}`),
  );
  const privileges = (await client.query<{ tbl: string | null; privilege: string; public: boolean; role: string; role_sql: string }>(FOREIGN_PRIVILEGES_SQL)).rows;
  problems.push(
    ...listed(privileges, 'privileges of other roles', (p) => {
      const who = p.public ? 'every role (PUBLIC)' : `role ${quoted(p.role)}`;
      const grantee = p.public ? 'PUBLIC' : p.role_sql;
      return p.tbl === null
        ? `${who} may CREATE in schema outlive: REVOKE CREATE ON SCHEMA outlive FROM ${grantee}`
        : `${who} holds ${p.privilege} on outlive.${p.tbl}: REVOKE ${p.privilege} ON outlive.${p.tbl} FROM ${grantee}`;
    }),
  );
  const made = madeByMigrations(migrations);
  const hooks = (await client.query<{ kind: string; name: string; tbl: string; name_sql: string; tbl_sql: string; calls: string | null; calls_ours: boolean | null }>(HOOKS_SQL)).rows;
  const strange = hooks.filter((h) => !made.has(hookKey(h.kind, h.tbl, h.name)) || h.calls_ours === false);
  problems.push(
    ...listed(strange, 'triggers, rules and policies', (h) => {
      const drop = `DROP ${h.kind.toUpperCase()} ${h.name_sql} ON outlive.${h.tbl_sql}`;
      const tag = made.get(hookKey(h.kind, h.tbl, h.name));
      return tag === undefined
        ? `${h.kind} ${quoted(h.name)} on outlive.${h.tbl_sql} was not made by outlive's migrations: ${drop}`
        : `${h.kind} ${quoted(h.name)} on outlive.${h.tbl_sql} calls ${h.calls}, not a function of outlive: ${drop}, then create it again as db/migrations/${tag}.sql does`;
    }),
  );
  if (problems.length === 0) return true;
  const others = [...owners].map(quoted);
  const whose =
    others.length === 0
      ? ''
      : ` If ${others.join(' or ')} is a role of yours (migrate ran as it before), run migrate as ${others.length === 1 ? others[0] : 'it'}, or hand the objects over to ${quoted(schema.me)} (as that role or a superuser) with the statements above; if not, they were not made by migrate: drop them.`;
  throw new ConfigError(
    printable(
      `outlive: migrate refuses schema outlive: ${problems.join('; ')}.${whose} ` +
        `Code in schema outlive (a trigger, a function, an operator, a view) runs with the privileges of whoever uses it, so migrate, running as ${quoted(schema.me)}, ` +
        'goes on only when that role owns the whole schema and no other role can add to it (docs/shared-database.md).',
    ),
  );
}

/** Each item in words, the first {@link LISTED}, then how many more. */
function listed<T>(items: readonly T[], what: string, say: (item: T) => string): string[] {
  const shown = items.slice(0, LISTED).map(say);
  return items.length > LISTED ? [...shown, `and ${items.length - LISTED} more ${what}`] : shown;
}

/** The ALTER statement's keyword for an object type as pg_identify_object names it. */
function alterKeyword(type: string): string {
  if (type === 'composite type') return 'TYPE';
  if (type === 'statistics object') return 'STATISTICS';
  return type.toUpperCase();
}

function hookKey(kind: string, table: string, name: string): string {
  return `${kind} ${name} on ${table}`;
}

/** The triggers, rules and policies the migration files make on outlive's tables, each with the file's tag. */
function madeByMigrations(migrations: readonly Migration[]): Map<string, string> {
  const name = String.raw`("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)`;
  const table = String.raw`(?:"outlive"|outlive)\.${name}`;
  const patterns: [string, RegExp][] = [
    ['trigger', new RegExp(String.raw`CREATE\s+(?:OR\s+REPLACE\s+)?(?:CONSTRAINT\s+)?TRIGGER\s+${name}[\s\S]*?\sON\s+${table}`, 'gi')],
    ['rule', new RegExp(String.raw`CREATE\s+(?:OR\s+REPLACE\s+)?RULE\s+${name}\s+AS\s+ON\s+\w+\s+TO\s+${table}`, 'gi')],
    ['policy', new RegExp(String.raw`CREATE\s+POLICY\s+${name}\s+ON\s+${table}`, 'gi')],
  ];
  const unquote = (s: string) => (s.startsWith('"') ? s.slice(1, -1).replace(/""/g, '"') : s.toLowerCase());
  const made = new Map<string, string>();
  for (const m of migrations) {
    const text = m.statements.join('\n');
    for (const [kind, pattern] of patterns) {
      for (const found of text.matchAll(pattern)) made.set(hookKey(kind, unquote(found[2]!), unquote(found[1]!)), m.tag);
    }
  }
  return made;
}

/** One migration file, as its journal entry and its text give it. */
interface Migration {
  tag: string;
  /** The journal's `when`: what `outlive.migrations.created_at` records. */
  when: number;
  hash: string;
  statements: string[];
}

/** Reads the journal and the SQL files of `folder`, in journal order. */
export function readMigrations(folder: string): Migration[] {
  const journal = JSON.parse(readFileSync(path.join(folder, 'meta/_journal.json'), 'utf8')) as { entries: { tag: string; when: number }[] };
  return journal.entries.map(({ tag, when }) => {
    const text = readFileSync(path.join(folder, `${tag}.sql`), 'utf8');
    return { tag, when, hash: createHash('sha256').update(text).digest('hex'), statements: text.split('--> statement-breakpoint') };
  });
}

/**
 * Applies every migration newer than the last one recorded, in the
 * transaction `client` is in (the one holding the migration lock, so the
 * record read here is the one the last migrate committed). `fresh`: there is
 * no schema yet, and this transaction makes it and its table, failing if
 * another has made it meanwhile rather than moving into that one.
 */
async function applyMigrations(client: Queryable, migrations: readonly Migration[], fresh: boolean): Promise<MigrateReport> {
  if (fresh) {
    await client.query('CREATE SCHEMA "outlive"');
    await client.query('CREATE TABLE "outlive"."migrations" (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)');
  }
  const { rows } = await client.query<{ created_at: string | null; total: number }>(
    'SELECT pg_catalog.max(created_at)::text AS created_at, pg_catalog.count(*)::int AS total FROM "outlive"."migrations"',
  );
  const last = rows[0]?.created_at == null ? null : Number(rows[0].created_at);
  const applied: string[] = [];
  for (const m of migrations.filter((m) => last === null || last < m.when)) {
    for (const statement of m.statements) await client.query(statement);
    await client.query('INSERT INTO "outlive"."migrations" (hash, created_at) VALUES ($1, $2)', [m.hash, m.when]);
    applied.push(m.tag);
  }
  return { applied, total: rows[0]!.total + applied.length };
}
