/**
 * Grants: the least privileges each part of an app needs on schema outlive,
 * as SQL to run. One source for them: `grants({ app, worker, dashboard })`
 * returns it, and `outlive grants --app ... --worker ... --dashboard ...`
 * prints it (docs/shared-database.md).
 *
 * The roles, and what each does:
 * - the migrator owns the schema (it ran `migrate`) and runs this SQL; it
 *   needs nothing granted;
 * - `app` enqueues (`enqueue`, `enqueueMany`, `batchEnqueue`) and starts runs
 *   (`startRun`): it inserts rows and reads back the few columns those
 *   return, and may not change or delete a row, nor read another task's
 *   input or output (`nudge` is an HTTP request and needs no database);
 * - `worker` runs passes and what surrounds them (the LISTEN worker, the
 *   drain, the cron route: claim, settle, recovery, leases, spawns,
 *   schedules, retention, the drain's nonces);
 * - `dashboard` reads everything but the nonces and the migrations, and
 *   retries and cancels: it updates only the columns those set.
 */
import { ConfigError } from '../model/errors.js';

/** Who does what: the role of each part, as names. The same role may be given for several. */
export interface GrantRoles {
  /** The role the app enqueues and starts runs as. */
  app?: string;
  /** The role passes run as: the LISTEN worker, the drain and cron functions. */
  worker?: string;
  /** The role the dashboard (and an operator's `outlive status`, `retry`, `cancel`) runs as. */
  dashboard?: string;
}

/** The parts of an app that get grants. */
export const GRANT_KINDS = ['app', 'worker', 'dashboard'] as const;
type Kind = (typeof GRANT_KINDS)[number];

/**
 * Each table of outlive and what each part may do with it. A table that is
 * not here (outlive.migrations) is the migrator's alone. test/roles.test.ts
 * runs every part as a role holding exactly these, and fails when a table of
 * the schema is missing here.
 */
export const TABLE_PRIVILEGES: Readonly<Record<string, Partial<Record<Kind, string>>>> = {
  tasks: {
    // What enqueue and startRun write, and what they return (enqueue reads a
    // taken key's row by name, key and state). Not state, attempts, lease,
    // output or errors: a row is written pending, as a task no one ran.
    app:
      'INSERT (name, queue, priority, max_attempts, timeout_ms, run_at, input, key, run_id, step, waiting_on, fair_key, limits, vt, trace_context), ' +
      // fair_key and vt: the turn of a task with fairness (outlive.fair_start).
      'SELECT (id, name, queue, state, run_at, key, step, fair_key, vt)',
    worker: 'SELECT, INSERT, UPDATE, DELETE',
    dashboard:
      'SELECT, UPDATE (state, attempts, max_attempts, interruptions, snoozes, run_at, finished_at, lease_owner, lease_expires_at, updated_at, waiting_on, last_error, vt, blocked_on, wait_key, wait_until, signal)',
  },
  runs: {
    app: 'INSERT (name, unfinished), SELECT (id)',
    worker: 'SELECT, UPDATE, DELETE',
    dashboard: 'SELECT, UPDATE (state, unfinished, failed_task_id, error, finished_at, updated_at)',
  },
  task_deps: { app: 'INSERT (run_id, task_id, depends_on)', worker: 'SELECT, INSERT', dashboard: 'SELECT' },
  recounts: { worker: 'SELECT, INSERT, DELETE' },
  leases: { worker: 'SELECT, INSERT, UPDATE, DELETE', dashboard: 'SELECT' },
  known_tasks: { worker: 'SELECT, INSERT, UPDATE', dashboard: 'SELECT' },
  schedules: { worker: 'SELECT, INSERT, UPDATE, DELETE', dashboard: 'SELECT' },
  schedule_slots: { worker: 'SELECT, INSERT, UPDATE, DELETE' },
  used_nonces: { worker: 'SELECT, INSERT, DELETE' },
  // Flow control: the claim takes slots, settles and recovery give them back
  // and a 429 pauses a key (worker); a cancel gives slots back, and an
  // operator changes limits, pauses and weights (dashboard).
  limits: { worker: 'SELECT, INSERT, UPDATE', dashboard: 'SELECT, INSERT, UPDATE' },
  fairness: { app: 'SELECT (queue, key, weight)', worker: 'SELECT', dashboard: 'SELECT, INSERT, UPDATE, DELETE' },
  queue_pauses: { worker: 'SELECT', dashboard: 'SELECT, INSERT, UPDATE, DELETE' },
  // The app signals through outlive.send_signal, which runs as the schema's owner: it needs nothing here.
  signals: { worker: 'SELECT, UPDATE, DELETE', dashboard: 'SELECT' },
};

/** The sequences of the serial ids the parts write (USAGE: nextval). */
export const SEQUENCE_USERS: Readonly<Record<string, readonly Kind[]>> = {
  tasks_id_seq: ['app', 'worker'],
  runs_id_seq: ['app'],
};

/**
 * The functions the parts call. Both claims: the one of 0010, and 0009's,
 * kept for passes of the previous release during a rolling deploy. The
 * trigger function is called by the trigger, which needs no grant.
 */
export const FUNCTION_CALLERS: Readonly<Record<string, readonly Kind[]>> = {
  'claim(pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.text[], pg_catalog.int4, pg_catalog.text, pg_catalog.int4, pg_catalog.int4, pg_catalog.text[])': ['worker'],
  'claim(pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.text[], pg_catalog.int4, pg_catalog.text, pg_catalog.int4, pg_catalog.int4)': ['worker'],
  'claim_tasks(pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.text[], pg_catalog.int4, pg_catalog.text, pg_catalog.int4, pg_catalog.int4, pg_catalog.text[], pg_catalog.int4)': ['worker'],
  'claim_governed(pg_catalog.timestamptz, pg_catalog.int4, pg_catalog.text[], pg_catalog.int4, pg_catalog.text, pg_catalog.int4, pg_catalog.int4, pg_catalog.text[], pg_catalog.bool)': ['worker'],
  'release_slots(pg_catalog.jsonb, pg_catalog.timestamptz)': ['worker', 'dashboard'],
  'rate_next_start(pg_catalog.jsonb, pg_catalog.float8, pg_catalog.float8, pg_catalog.float8, pg_catalog.float8, pg_catalog.float8)': ['worker', 'dashboard'],
  'fair_start(pg_catalog.text, pg_catalog.text)': ['app', 'worker'],
  'send_signal(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.int8)': ['app', 'worker'],
  'begin_waits(pg_catalog.int8[], pg_catalog.int4[], pg_catalog.text, pg_catalog.timestamptz)': ['worker'],
  'release_dependents(pg_catalog.int8[], pg_catalog.timestamptz)': ['worker'],
  'finish_runs(pg_catalog.timestamptz, pg_catalog.int8[], pg_catalog.int4[], pg_catalog.int8[], pg_catalog.text[])': ['worker'],
  'signal_lock(pg_catalog.text)': ['worker'],
  'enqueue_keyed(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int4, pg_catalog.int4, pg_catalog.timestamptz, pg_catalog.text[], pg_catalog.text[], pg_catalog.text[], pg_catalog.text[], pg_catalog.bool, pg_catalog.text)': ['app', 'worker'],
};

const WHAT: Record<Kind, string> = {
  app: 'enqueue, enqueueMany, batchEnqueue, startRun, signal (nudge needs no database)',
  worker: 'passes (claim, settle, recovery, leases, spawns, waits), schedules, retention, the drain\'s nonces, the signal route',
  dashboard: 'the pages and `outlive status`, tasks, runs, run, task; retry and cancel',
};

/** A role's name as SQL writes it. */
function ident(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

function literal(text: string): string {
  return `'${text.replace(/'/g, "''")}'`;
}

/**
 * The SQL that gives each role exactly the privileges its part needs on
 * schema outlive: what it held there before is revoked first, so running it
 * again, or after a release's migrations added a table, leaves each role with
 * what this release needs. It also takes from PUBLIC the EXECUTE that
 * Postgres gives every role on new functions. Run it as the owner of schema
 * outlive (the role that runs migrate), after each migrate; it refuses, and
 * changes nothing, when run by another role, or given a role that owns the
 * schema, is a superuser (no grant limits one), or does not exist.
 *
 * ```ts
 * await migratorClient.query(grants({ app: 'shop_app', worker: 'shop_worker', dashboard: 'shop_ops' }));
 * ```
 */
export function grants(roles: GrantRoles): string {
  const given = GRANT_KINDS.flatMap((kind) => {
    const name = roles?.[kind];
    if (name === undefined) return [];
    if (typeof name !== 'string' || name.length === 0 || name.includes('\0') || new TextEncoder().encode(name).length > 63) {
      throw new ConfigError(`outlive: grants: the ${kind} role must be a role's name of 1-63 bytes, without NUL; got ${JSON.stringify(name)}`);
    }
    return [[kind, name] as const];
  });
  if (given.length === 0) throw new ConfigError('outlive: grants: name at least one role: { app, worker, dashboard }');
  const names = [...new Set(given.map(([, name]) => name))];
  const all = names.map(ident).join(', ');
  // A dollar quote for the check's body that no role's name can end.
  let tag = '$outlive_grants$';
  while (names.some((n) => n.includes(tag))) tag = tag.replace(/\$$/, '_$');
  const out: string[] = [
    `-- outlive grants for ${given.map(([kind, name]) => `${kind} ${ident(name)}`).join(', ')}.`,
    '-- Run as the owner of schema outlive (the role that runs migrate), after every migrate.',
    '-- Each role ends with exactly these privileges on the schema: what it held there is revoked first.',
    'BEGIN;',
    'SET LOCAL search_path = pg_catalog, pg_temp;',
    `DO ${tag}`,
    'DECLARE',
    '  owner pg_catalog.oid;',
    '  r pg_catalog.text;',
    'BEGIN',
    "  SELECT n.nspowner INTO owner FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'outlive';",
    "  IF owner IS NULL THEN RAISE EXCEPTION 'outlive grants: there is no schema outlive in this database: run migrate first'; END IF;",
    "  IF NOT pg_catalog.pg_has_role(owner, 'USAGE') THEN",
    "    RAISE EXCEPTION 'outlive grants: run these as %, the owner of schema outlive, not as %', owner::pg_catalog.regrole, CURRENT_USER;",
    '  END IF;',
    `  FOREACH r IN ARRAY ARRAY[${names.map((n) => literal(ident(n))).join(', ')}]::pg_catalog.text[] LOOP`,
    '    IF r::pg_catalog.regrole::pg_catalog.oid OPERATOR(pg_catalog.=) owner THEN',
    "      RAISE EXCEPTION 'outlive grants: role % owns schema outlive: give the app, the worker and the dashboard roles of their own', r;",
    '    END IF;',
    '    IF (SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) r::pg_catalog.regrole::pg_catalog.oid) THEN',
    "      RAISE EXCEPTION 'outlive grants: role % is a superuser, which no grant limits: give it a role that is not (CREATE ROLE ... NOSUPERUSER)', r;",
    '    END IF;',
    '  END LOOP;',
    'END',
    `${tag};`,
    `REVOKE ALL ON SCHEMA outlive FROM ${all};`,
    `REVOKE ALL ON ALL TABLES IN SCHEMA outlive FROM ${all};`,
    `REVOKE ALL ON ALL SEQUENCES IN SCHEMA outlive FROM ${all};`,
    `REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outlive FROM ${all}, PUBLIC;`,
  ];
  for (const [kind, name] of given) {
    const role = ident(name);
    out.push('', `-- ${kind}: ${WHAT[kind]}`, `GRANT USAGE ON SCHEMA outlive TO ${role};`);
    for (const [table, privileges] of Object.entries(TABLE_PRIVILEGES)) {
      const p = privileges[kind];
      if (p) out.push(`GRANT ${p} ON outlive.${table} TO ${role};`);
    }
    const sequences = Object.entries(SEQUENCE_USERS).filter(([, users]) => users.includes(kind)).map(([s]) => `outlive.${s}`);
    if (sequences.length > 0) out.push(`GRANT USAGE ON SEQUENCE ${sequences.join(', ')} TO ${role};`);
    const functions = Object.entries(FUNCTION_CALLERS).filter(([, callers]) => callers.includes(kind)).map(([f]) => `outlive.${f}`);
    if (functions.length > 0) out.push(`GRANT EXECUTE ON FUNCTION ${functions.join(', ')} TO ${role};`);
  }
  out.push('COMMIT;', '');
  return out.join('\n');
}
