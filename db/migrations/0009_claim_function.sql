-- The claim as a function, so that what a worker sends for it is a prepared
-- statement and the claim's plan is made once per connection, not per claim.
-- Sent unnamed (0000-0008), a claim of one task cost 460-530 us of backend CPU,
-- more than half of it parsing and planning; this way 200-225 us (2 cores,
-- PostgreSQL 15, 30,000 ready rows).
--
-- Why not a prepared statement of the claim itself: Postgres switches a
-- prepared statement to a generic plan after five runs, and one made while
-- outlive.tasks held a few rows scanned the whole table for every row it
-- claimed once a burst arrived (~1 s a claim of 500 among 20,000). Here the
-- plan is generic from the first call (plan_cache_mode) and made with
-- sequential scans priced out (enable_seqscan = off: a penalty, not a ban), so
-- on any table, however small, it is the index plan: tasks_claim_idx for the
-- ready rows, the primary key for the update. Both settings hold only while
-- the function runs.
--
-- The body is CLAIM_SQL of src/claim.ts, character for character ($1-$7 are
-- the arguments; test/claim.test.ts checks the two match). Returned columns
-- share names with outlive.tasks', so references in the body mean the table's.
CREATE FUNCTION "outlive"."claim"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $claim$
#variable_conflict use_column
BEGIN
  RETURN QUERY
WITH ready AS (
  SELECT id FROM outlive.tasks
  WHERE state = 'pending' AND waiting_on = 0
    AND run_at <= coalesce($1::timestamptz, now())
    AND timeout_ms <= $2
    AND ($3::text[] IS NULL OR queue = ANY($3::text[]))
  ORDER BY priority DESC NULLS LAST, run_at, id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
)
UPDATE outlive.tasks t
SET state = 'running',
    attempts = t.attempts + 1,
    lease_owner = $5,
    lease_expires_at = coalesce($1::timestamptz, now()) + (least(t.timeout_ms, $7) + $6) * interval '1 millisecond',
    started_at = coalesce($1::timestamptz, now()),
    updated_at = coalesce($1::timestamptz, now())
FROM ready
WHERE t.id = ready.id AND t.state = 'pending'
RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text;
END;
$claim$;
