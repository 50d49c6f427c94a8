CREATE TABLE "outlive"."known_tasks" (
	"name" text PRIMARY KEY NOT NULL,
	"seen_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "outlive"."recounts" (
	"task_id" bigint PRIMARY KEY NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
-- A spawn that waited for a step already succeeded had that success counted
-- off its waiting_on twice (0000-0009): such rows sit at -1, or ran early.
-- Rows a release could not see (see outlive.recounts) sit above their count.
-- Every pending row of a run is recounted here, under a lock that keeps
-- passes out until this commits, so no release lands between count and write;
-- the CHECK then refuses a negative count for good.
LOCK TABLE "outlive"."tasks" IN SHARE ROW EXCLUSIVE MODE;--> statement-breakpoint
UPDATE "outlive"."tasks" t SET "waiting_on" = c.n, "updated_at" = now()
FROM (
  SELECT d.task_id, count(*) FILTER (WHERE p.state IS DISTINCT FROM 'succeeded')::int AS n
  FROM "outlive"."task_deps" d LEFT JOIN "outlive"."tasks" p ON p.id = d.depends_on
  GROUP BY d.task_id
) c
WHERE t.id = c.task_id AND t.state = 'pending' AND t.waiting_on <> c.n;--> statement-breakpoint
UPDATE "outlive"."tasks" SET "waiting_on" = 0 WHERE "waiting_on" < 0;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_waiting_on_check" CHECK ("outlive"."tasks"."waiting_on" >= 0);--> statement-breakpoint
-- The claim, now of the task names the pass can run only ($8): a pass no
-- longer claims a task it has no handler for and fails it. The body is
-- CLAIM_SQL of src/claim.ts, character for character (test/claim.test.ts);
-- the settings are 0009's, for the reasons given there, and bitmap scans
-- priced out too: a generic plan cannot know how many names $8 holds, guesses
-- the filter keeps almost nothing, and with 20,000 ready rows chose a bitmap
-- scan of all of them and a sort for every claim, where the index already
-- holds them in claim order. The 0009 function stays for passes of the
-- previous release during a rolling deploy.
CREATE FUNCTION "outlive"."claim"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[]
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
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
    AND name = ANY($8::text[])
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