-- Every function outlive defines now runs with its search_path pinned to
-- pg_catalog, then pg_temp. Postgres resolves the functions and operators
-- a function's body names through the path of the session that calls it,
-- not of the role that made it: a role that can create objects in a schema
-- on the app's path (CREATE on public, every role's right before
-- PostgreSQL 15; a schema named like the app's role, first on the default
-- path "$user", public) could plant an operator = on outlive.task_state or
-- an integer = integer, and Postgres, preferring an exact match of argument
-- types to pg_catalog's anyenum = anyenum, or the schema listed first when
-- the types are the same, would run it as the app's role in every claim and
-- on every insert of tasks (the trigger below). pg_temp is listed last, so
-- that a temporary table cannot stand in for anything either (functions and
-- operators are never looked for there); the tables are named with their
-- schema. The statements outlive sends name pg_catalog's functions and
-- operators themselves, whatever the caller's path (ARCHITECTURE.md, "Names
-- in SQL"); here the functions' own path makes sure of it.
--
-- The claim, redefined: its body is CLAIM_SQL of src/pass/claim.ts,
-- character for character (test/claim.test.ts), which now names its
-- functions and operators with their schema too, like every statement
-- outlive sends. They are pg_catalog's, as before, so the plan is 0010's
-- (test/claim.test.ts counts the rows a claim reads); so are the other
-- settings, for the reasons given in 0009 and 0010.
CREATE OR REPLACE FUNCTION "outlive"."claim"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[]
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET search_path = pg_catalog, pg_temp
AS $claim$
#variable_conflict use_column
BEGIN
  RETURN QUERY
WITH ready AS (
  SELECT id FROM outlive.tasks
  WHERE state OPERATOR(pg_catalog.=) 'pending' AND waiting_on OPERATOR(pg_catalog.=) 0
    AND run_at OPERATOR(pg_catalog.<=) coalesce($1::timestamptz, pg_catalog.now())
    AND timeout_ms OPERATOR(pg_catalog.<=) $2
    AND ($3::text[] IS NULL OR queue OPERATOR(pg_catalog.=) ANY ($3::text[]))
    AND name OPERATOR(pg_catalog.=) ANY ($8::text[])
  ORDER BY priority DESC NULLS LAST, run_at, id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
)
UPDATE outlive.tasks t
SET state = 'running',
    attempts = t.attempts OPERATOR(pg_catalog.+) 1,
    lease_owner = $5,
    lease_expires_at = coalesce($1::timestamptz, pg_catalog.now())
      OPERATOR(pg_catalog.+) ((least(t.timeout_ms, $7) OPERATOR(pg_catalog.+) $6) OPERATOR(pg_catalog.*) interval '1 millisecond'),
    started_at = coalesce($1::timestamptz, pg_catalog.now()),
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
FROM ready
WHERE t.id OPERATOR(pg_catalog.=) ready.id AND t.state OPERATOR(pg_catalog.=) 'pending'
RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text;
END;
$claim$;
--> statement-breakpoint
-- The claim of 0009, without task names, kept for passes of older releases
-- during a rolling deploy: its body stays, under the same path.
ALTER FUNCTION "outlive"."claim"(timestamptz, integer, text[], integer, text, integer, integer) SET search_path = pg_catalog, pg_temp;--> statement-breakpoint
-- The trigger that wakes listeners (0001): its comparisons and pg_notify are
-- pg_catalog's under this path.
ALTER FUNCTION "outlive"."notify_ready"() SET search_path = pg_catalog, pg_temp;
