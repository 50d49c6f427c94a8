CREATE TABLE "outlive"."fairness" (
	"queue" text NOT NULL,
	"key" text NOT NULL,
	"weight" double precision NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "fairness_queue_key_pk" PRIMARY KEY("queue","key"),
	CONSTRAINT "fairness_weight_check" CHECK ("outlive"."fairness"."weight" > 0 AND "outlive"."fairness"."weight" <= 1000)
);
--> statement-breakpoint
CREATE TABLE "outlive"."limits" (
	"key" text PRIMARY KEY NOT NULL,
	"concurrency" integer,
	"rate_limit" integer,
	"rate_period_ms" integer,
	"running" integer DEFAULT 0 NOT NULL,
	"starts" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"paused_until" timestamp with time zone,
	"paused_reason" text,
	"paused_by" text,
	"wake_at" timestamp with time zone,
	"seen_concurrency" integer,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "limits_running_check" CHECK ("outlive"."limits"."running" >= 0),
	CONSTRAINT "limits_paused_by_check" CHECK ("outlive"."limits"."paused_by" IN ('hand', '429')),
	CONSTRAINT "limits_values_check" CHECK ("outlive"."limits"."concurrency" > 0 AND "outlive"."limits"."rate_limit" > 0 AND "outlive"."limits"."rate_period_ms" > 0 AND ("outlive"."limits"."rate_limit" IS NULL) = ("outlive"."limits"."rate_period_ms" IS NULL))
);
--> statement-breakpoint
CREATE TABLE "outlive"."queue_pauses" (
	"queue" text PRIMARY KEY NOT NULL,
	"reason" text,
	"paused_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
DROP INDEX "outlive"."tasks_claim_idx";--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "fair_key" text;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "vt" double precision;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "limits" jsonb;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "blocked_on" text;--> statement-breakpoint
CREATE INDEX "limits_wake_idx" ON "outlive"."limits" USING btree ("wake_at") WHERE "outlive"."limits"."wake_at" IS NOT NULL;--> statement-breakpoint
CREATE INDEX "tasks_governed_idx" ON "outlive"."tasks" USING btree ("priority" DESC NULLS LAST,"vt","id") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."waiting_on" = 0 AND "outlive"."tasks"."fair_key" IS NOT NULL AND "outlive"."tasks"."vt" IS NOT NULL AND "outlive"."tasks"."blocked_on" IS NULL;--> statement-breakpoint
CREATE INDEX "tasks_fair_last_idx" ON "outlive"."tasks" USING btree ("queue","fair_key","vt") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."fair_key" IS NOT NULL AND "outlive"."tasks"."vt" IS NOT NULL;--> statement-breakpoint
CREATE INDEX "tasks_fair_head_idx" ON "outlive"."tasks" USING btree ("queue","vt") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."fair_key" IS NOT NULL AND "outlive"."tasks"."vt" IS NOT NULL;--> statement-breakpoint
CREATE INDEX "tasks_unplaced_idx" ON "outlive"."tasks" USING btree ("run_at","id") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."waiting_on" = 0 AND "outlive"."tasks"."fair_key" IS NOT NULL AND "outlive"."tasks"."vt" IS NULL;--> statement-breakpoint
CREATE INDEX "tasks_blocked_idx" ON "outlive"."tasks" USING btree ("blocked_on","priority" DESC NULLS LAST,"vt","id") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."blocked_on" IS NOT NULL;--> statement-breakpoint
CREATE INDEX "tasks_claim_idx" ON "outlive"."tasks" USING btree ("priority" DESC NULLS LAST,"run_at","id") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."waiting_on" = 0 AND "outlive"."tasks"."fair_key" IS NULL;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_governed_check" CHECK ("outlive"."tasks"."fair_key" IS NOT NULL OR ("outlive"."tasks"."limits" IS NULL AND "outlive"."tasks"."vt" IS NULL AND "outlive"."tasks"."blocked_on" IS NULL));--> statement-breakpoint
-- Flow control (issue 26; docs/flow-control.md, ARCHITECTURE.md). A task
-- row with limits or fairness (fair_key not null) is governed: claimed by
-- outlive.claim_governed below, in turn (vt) and within its keys' limits,
-- its slots given back by outlive.release_slots inside the statement that
-- settles, recovers or cancels it. Other rows are claimed as before, by the
-- plain claim, whose index and body now leave governed rows out.
--
-- The plain claim: CLAIM_SQL of src/pass/claim.ts, character for character
-- (test/claim.test.ts), now without governed rows and paused queues.
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
  WHERE state OPERATOR(pg_catalog.=) 'pending' AND waiting_on OPERATOR(pg_catalog.=) 0 AND fair_key IS NULL
    AND run_at OPERATOR(pg_catalog.<=) coalesce($1::timestamptz, pg_catalog.now())
    AND timeout_ms OPERATOR(pg_catalog.<=) $2
    AND ($3::text[] IS NULL OR queue OPERATOR(pg_catalog.=) ANY ($3::text[]))
    AND name OPERATOR(pg_catalog.=) ANY ($8::text[])
    AND queue OPERATOR(pg_catalog.<>) ALL (ARRAY(SELECT p.queue FROM outlive.queue_pauses p))
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
-- The claim of 0009 (passes of releases before task names), redefined the
-- same way: its old body no longer matches tasks_claim_idx, and it must not
-- take governed rows, whose slots those passes would never give back.
CREATE OR REPLACE FUNCTION "outlive"."claim"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET search_path = pg_catalog, pg_temp
AS $claim$
#variable_conflict use_column
BEGIN
  RETURN QUERY
WITH ready AS (
  SELECT id FROM outlive.tasks
  WHERE state = 'pending' AND waiting_on = 0 AND fair_key IS NULL
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
--> statement-breakpoint
-- Where a fairness key's next row goes in its queue's turns: one turn
-- (1/weight) after the key's last ready row, or, if it has none, at the
-- head of the queue's ready rows (so a key that was idle neither jumps ahead
-- of rows already waiting nor falls behind a backlog it did not write).
-- Two index probes, whatever the number of keys with a backlog.
CREATE FUNCTION "outlive"."fair_start"(q text, k text, OUT base double precision, OUT step double precision)
LANGUAGE sql STABLE
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $fair$
  SELECT coalesce(
           (SELECT t.vt FROM outlive.tasks t
            WHERE t.state = 'pending' AND t.queue = q AND t.fair_key = k AND t.vt IS NOT NULL
            ORDER BY t.queue DESC, t.fair_key DESC, t.vt DESC LIMIT 1) + w.step,
           (SELECT t.vt FROM outlive.tasks t
            WHERE t.state = 'pending' AND t.queue = q AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL
            ORDER BY t.queue, t.vt LIMIT 1),
           0),
         w.step
  FROM (SELECT 1.0 / coalesce((SELECT f.weight FROM outlive.fairness f WHERE f.queue = q AND f.key = k), 1) AS step) w
$fair$;
--> statement-breakpoint
-- Gives back what tasks held of their keys: one slot each, and their rate
-- starts corrected by the cost they reported (0 removes a start that never
-- happened: a task handed back unstarted). Wakes the keys' waiting tasks.
-- Applies a 429's pause. Called only from inside the statement that
-- settles, recovers or cancels those tasks (src/pass/settle.ts,
-- src/pass/recover.ts, src/admin/cancel.ts), with the rows that statement
-- changed: a task whose statement matched nothing gives back nothing.
-- items: [[limits, task id, attempt, {"costs": {key|"*": n}, "pause": {...}}], ...]
-- Its joins go key by key through the primary key, whatever the plan's
-- statistics say: a hash join walked all of outlive.limits on every settle
-- (docs/benchmarks.md, "Flow control").
CREATE FUNCTION "outlive"."release_slots"(items jsonb, now_at timestamptz) RETURNS integer
LANGUAGE plpgsql
SET jit = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET search_path = pg_catalog, pg_temp
AS $release$
DECLARE
  t_now timestamptz := coalesce(now_at, now());
  released integer := 0;
  keys text[];
BEGIN
  IF items IS NULL OR jsonb_array_length(items) = 0 THEN RETURN 0; END IF;
  -- Keys locked in key order: two releases never wait on each other in a
  -- cycle. Looked up by key (= ANY of an array), never by a join a plan
  -- could turn into a walk of every key.
  keys := ARRAY(SELECT DISTINCT x->>'k' FROM jsonb_array_elements(items) i, jsonb_array_elements(i->0) x);
  PERFORM 1 FROM outlive.limits l WHERE l.key = ANY (keys) ORDER BY l.key FOR UPDATE;
  WITH held AS (
    SELECT x->>'k' AS lkey, (i->>1) || ':' || (i->>2) AS start_id,
           coalesce(i->3->'costs'->(x->>'k'), i->3->'costs'->'*') AS fix
    FROM jsonb_array_elements(items) i, jsonb_array_elements(i->0) x
  ), by_key AS (
    SELECT h.lkey, count(*)::int AS n,
           jsonb_object_agg(h.start_id, h.fix) FILTER (WHERE jsonb_typeof(h.fix) = 'number') AS fixes
    FROM held h GROUP BY h.lkey
  )
  UPDATE outlive.limits l
  SET running = l.running - b.n,
      starts = CASE WHEN b.fixes IS NULL THEN l.starts ELSE coalesce((
        SELECT jsonb_agg(CASE WHEN b.fixes ? ((s->>2) || ':' || (s->>3))
                              THEN jsonb_build_array(s->0, b.fixes->((s->>2) || ':' || (s->>3)), s->2, s->3) ELSE s END ORDER BY a.o)
        FROM jsonb_array_elements(l.starts) WITH ORDINALITY a(s, o)
        WHERE NOT (b.fixes ? ((s->>2) || ':' || (s->>3)) AND (b.fixes->>((s->>2) || ':' || (s->>3)))::float8 <= 0)), '[]'::jsonb) END,
      -- '-infinity': due at any clock (a claim's, or an operator's view's, however close).
      wake_at = CASE WHEN l.wake_at IS NULL THEN NULL ELSE '-infinity'::timestamptz END,
      updated_at = t_now
  FROM by_key b
  WHERE l.key = b.lkey;
  GET DIAGNOSTICS released = ROW_COUNT;
  -- A provider's 429: no task of the key starts before its Retry-After.
  IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(items) i WHERE jsonb_typeof(i->3->'pause') = 'object') THEN RETURN released; END IF;
  INSERT INTO outlive.limits AS l (key, paused_until, paused_reason, paused_by, updated_at)
  SELECT p->>'key', max(t_now + ((p->>'ms')::float8 * interval '1 millisecond')),
         (array_agg(p->>'reason' ORDER BY (p->>'ms')::float8 DESC))[1], '429', t_now
  FROM (SELECT i->3->'pause' AS p FROM jsonb_array_elements(items) i) x
  WHERE p IS NOT NULL AND jsonb_typeof(p) = 'object'
  GROUP BY p->>'key'
  ORDER BY 1
  ON CONFLICT (key) DO UPDATE
  -- The later of the two ends, with its reason and who made it: a 429 never shortens a pause.
  SET paused_until = greatest(coalesce(l.paused_until, '-infinity'), excluded.paused_until),
      paused_reason = CASE WHEN l.paused_until IS NULL OR excluded.paused_until > l.paused_until THEN excluded.paused_reason ELSE l.paused_reason END,
      paused_by = CASE WHEN l.paused_until IS NULL OR excluded.paused_until > l.paused_until THEN '429' ELSE l.paused_by END,
      updated_at = t_now;
  RETURN released;
END;
$release$;
--> statement-breakpoint
-- The governed claim: takes up to claim_limit ready governed rows in turn
-- (priority, then vt), each only if every one of its keys has room: not
-- paused, fewer running than its concurrency, and its rate's window (any
-- window of rate_period_ms) holding no more than rate_limit with this start's
-- cost. All of a row's keys or none, in this one transaction: the keys are
-- locked FOR UPDATE SKIP LOCKED, so a claim never waits for another claim or
-- a settle (a row whose key is busy is left for the next claim) and never
-- deadlocks. A row that finds a key full leaves the claim's index
-- (blocked_on) until that key wakes: when a slot is given back, its window
-- has room again, or its pause ends. What a claim reads grows with the rows
-- it takes and wakes, not with the keys or rows waiting.
--
-- Its plans are generic and made with few statistics, so, as with the
-- plain claim, the settings price out what would read the backlog: a
-- sequential scan, and a sort (with an estimate of one ready row, sorting
-- "one" row looked cheaper than reading tasks_governed_idx in its order;
-- measured, a claim of 50 with 50,000 ready rows sorted them all, ~200 ms).
-- Those prices push a plan's cost past jit_above_cost where a sort cannot be
-- avoided (a window over a few rows), and compiling it took 100-350 ms per
-- statement: jit is off. Claim of 50 with 50,000 ready: 8-9 ms.
CREATE FUNCTION "outlive"."claim_governed"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[], write_keys boolean
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text,
  fair_key text, limits jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $governed$
#variable_conflict use_column
DECLARE
  t_now timestamptz := coalesce(now_at, now());
  now_ms double precision := extract(epoch FROM coalesce(now_at, now())) * 1000;
  paused text[] := ARRAY(SELECT p.queue FROM outlive.queue_pauses p);
  c record;
  w record;
  kr record;
  e jsonb;
  picked bigint[] := '{}';
  examined integer := 0;
  got integer;
  n integer;
  cap integer;
  lim double precision;
  per double precision;
  cost double precision;
  used double precision;
  block_key text;
  block_until timestamptz;
  woken text[] := '{}';
  reblocked text[] := '{}';
  c_keys text[];
  cand text[];
  full_keys text[] := '{}';
  blocked_ids bigint[] := '{}';
  blocked_keys text[] := '{}';
  block_full boolean;
BEGIN
  -- 1. Place ready rows not yet in turn: due at a later time, retried, or
  --    steps whose dependencies succeeded.
  WITH due AS (
    SELECT t.id AS tid, t.queue AS tq, t.fair_key AS tk FROM outlive.tasks t
    WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NULL AND t.run_at <= t_now
    ORDER BY t.run_at, t.id
    LIMIT greatest(claim_limit * 4, 100)
    FOR UPDATE SKIP LOCKED
  ), turn AS (
    SELECT g.tq, g.tk, b.base, b.step FROM (SELECT DISTINCT d.tq, d.tk FROM due d) g, LATERAL outlive.fair_start(g.tq, g.tk) b
  ), numbered AS (
    SELECT d.tid, d.tq, d.tk, row_number() OVER (PARTITION BY d.tq, d.tk ORDER BY d.tid) AS nth FROM due d
  )
  UPDATE outlive.tasks t SET vt = turn.base + (numbered.nth - 1) * turn.step
  FROM numbered JOIN turn ON turn.tq = numbered.tq AND turn.tk = numbered.tk
  WHERE t.id = numbered.tid;

  -- 2. Wake the rows waiting for keys whose time came (a slot given back, a
  --    window with room, a pause ended): as many as could start, in the
  --    claim's order (priority, then turn).
  FOR w IN
    SELECT l.key AS lkey, l.running AS lrunning, coalesce(l.concurrency, l.seen_concurrency) AS lcap
    FROM outlive.limits l WHERE l.wake_at <= t_now ORDER BY l.key FOR UPDATE SKIP LOCKED
  LOOP
    n := CASE WHEN w.lcap IS NULL THEN claim_limit ELSE least(claim_limit, greatest(w.lcap - w.lrunning, 1)) END;
    UPDATE outlive.tasks t SET blocked_on = NULL
    FROM (SELECT b.id AS bid FROM outlive.tasks b
          WHERE b.blocked_on = w.lkey AND b.state = 'pending' ORDER BY b.priority DESC NULLS LAST, b.vt, b.id LIMIT n FOR UPDATE SKIP LOCKED) x
    WHERE t.id = x.bid;
    UPDATE outlive.limits l
    SET wake_at = CASE WHEN EXISTS (SELECT 1 FROM outlive.tasks b WHERE b.blocked_on = w.lkey AND b.state = 'pending')
                       THEN 'infinity'::timestamptz END
    WHERE l.key = w.lkey;
    woken := woken || w.lkey;
  END LOOP;

  -- 3. The keys of the rows next in turn that have no key row yet get one,
  --    in key order, before any key is locked, and only in the first call
  --    of a transaction (write_keys): ON CONFLICT waits for another claim
  --    writing the same key, and writes in one key order per transaction
  --    cannot wait in a cycle. Rows whose keys are not written yet wait for
  --    the next claim. Existing keys are found by key (= ANY), never by a
  --    join a generic plan could make a walk of every key.
  IF write_keys THEN
  cand := ARRAY(
    SELECT DISTINCT x->>'k' FROM (
      SELECT t.limits AS tl FROM outlive.tasks t
      WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL AND t.blocked_on IS NULL
        AND t.run_at <= t_now AND t.timeout_ms <= max_timeout_ms
        AND (queues IS NULL OR t.queue = ANY (queues)) AND t.name = ANY (names) AND t.queue <> ALL (paused)
      ORDER BY t.priority DESC NULLS LAST, t.vt, t.id
      LIMIT claim_limit * 4 + 20
    ) r, jsonb_array_elements(r.tl) x
    WHERE r.tl IS NOT NULL);
  cand := ARRAY(SELECT k FROM unnest(cand) k
                WHERE k <> ALL (ARRAY(SELECT l.key FROM outlive.limits l WHERE l.key = ANY (cand))));
  IF cardinality(cand) > 0 THEN
    INSERT INTO outlive.limits (key) SELECT k FROM unnest(cand) k ORDER BY 1 ON CONFLICT (key) DO NOTHING;
  END IF;
  END IF;

  -- 4. Admit in turn.
  FOR c IN
    SELECT t.id AS tid, t.limits AS tl, t.attempts AS ta FROM outlive.tasks t
    WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL AND t.blocked_on IS NULL
      AND t.run_at <= t_now AND t.timeout_ms <= max_timeout_ms
      AND (queues IS NULL OR t.queue = ANY (queues)) AND t.name = ANY (names) AND t.queue <> ALL (paused)
    ORDER BY t.priority DESC NULLS LAST, t.vt, t.id
    FOR UPDATE OF t SKIP LOCKED
  LOOP
    EXIT WHEN cardinality(picked) >= claim_limit OR examined >= claim_limit * 4 + 20;
    examined := examined + 1;
    IF c.tl IS NULL THEN
      picked := picked || c.tid;
      CONTINUE;
    END IF;
    c_keys := ARRAY(SELECT x->>'k' FROM jsonb_array_elements(c.tl) x);
    -- A key this claim found full or paused stays so until it commits (its
    -- row is locked): the row waits for it too, set aside below with the rest.
    IF c_keys && full_keys THEN
      blocked_ids := blocked_ids || c.tid;
      blocked_keys := blocked_keys || (SELECT k FROM unnest(c_keys) k WHERE k = ANY (full_keys) LIMIT 1);
      CONTINUE;
    END IF;
    -- All of its keys, or leave it for the next claim (a key busy elsewhere,
    -- or not yet written). Looked up by key (= ANY of an array): a join or
    -- IN here was planned, generically, as a walk of every key in the table.
    -- SKIP LOCKED never waits, so the order the keys are locked in cannot
    -- make a cycle with a settle's.
    SELECT count(*) INTO got FROM (
      SELECT 1 FROM outlive.limits l WHERE l.key = ANY (c_keys) FOR UPDATE SKIP LOCKED) k;
    CONTINUE WHEN got < jsonb_array_length(c.tl);
    block_key := NULL;
    block_full := false;
    FOR e IN SELECT x FROM jsonb_array_elements(c.tl) x LOOP
      SELECT l.key AS lkey, l.running, l.concurrency, l.rate_limit, l.rate_period_ms, l.starts, l.paused_until
        INTO kr FROM outlive.limits l WHERE l.key = e->>'k';
      IF kr.paused_until > t_now THEN
        block_key := kr.lkey; block_until := kr.paused_until; block_full := true; EXIT;
      END IF;
      cap := coalesce(kr.concurrency, (e->>'n')::integer);
      IF cap IS NOT NULL AND kr.running >= cap THEN
        block_key := kr.lkey; block_until := 'infinity'; block_full := true; EXIT;
      END IF;
      lim := coalesce(kr.rate_limit, (e->>'r')::double precision);
      IF lim IS NOT NULL THEN
        per := coalesce(kr.rate_period_ms, (e->>'p')::double precision);
        cost := coalesce((e->>'c')::double precision, 1);
        SELECT coalesce(sum((s->>1)::double precision), 0) INTO used
        FROM jsonb_array_elements(kr.starts) s WHERE (s->>0)::double precision > now_ms - per;
        IF used + cost > lim THEN
          -- Waits until enough of the window's starts are older than the period.
          SELECT to_timestamp((z.at + per) / 1000) INTO block_until FROM (
            SELECT (s->>0)::double precision AS at,
                   sum((s->>1)::double precision) OVER (ORDER BY (s->>0)::double precision ROWS UNBOUNDED PRECEDING) AS freed
            FROM jsonb_array_elements(kr.starts) s WHERE (s->>0)::double precision > now_ms - per) z
          WHERE used - z.freed + cost <= lim ORDER BY z.at LIMIT 1;
          block_key := kr.lkey; block_until := coalesce(block_until, 'infinity'); EXIT;
        END IF;
      END IF;
    END LOOP;
    IF block_key IS NOT NULL THEN
      reblocked := reblocked || block_key;
      blocked_ids := blocked_ids || c.tid;
      blocked_keys := blocked_keys || block_key;
      IF block_full THEN full_keys := full_keys || block_key; END IF;
      UPDATE outlive.limits l SET wake_at = least(coalesce(l.wake_at, 'infinity'::timestamptz), block_until) WHERE l.key = block_key;
      CONTINUE;
    END IF;
    UPDATE outlive.limits l
    SET running = l.running + 1,
        seen_concurrency = coalesce((x->>'n')::integer, l.seen_concurrency),
        starts = CASE WHEN coalesce(l.rate_limit, (x->>'r')::integer) IS NULL THEN l.starts ELSE
          coalesce((SELECT jsonb_agg(s ORDER BY (s->>0)::double precision) FROM jsonb_array_elements(l.starts) s
                    WHERE (s->>0)::double precision > now_ms - coalesce(l.rate_period_ms, (x->>'p')::double precision)), '[]'::jsonb)
          || jsonb_build_array(jsonb_build_array(now_ms, coalesce((x->>'c')::double precision, 1), c.tid, c.ta + 1)) END,
        updated_at = t_now
    FROM jsonb_array_elements(c.tl) x
    WHERE l.key = ANY (c_keys) AND l.key = x->>'k';
    picked := picked || c.tid;
  END LOOP;

  -- The rows refused leave the claim's index until their key wakes.
  IF cardinality(blocked_ids) > 0 THEN
    UPDATE outlive.tasks t SET blocked_on = b.k
    FROM unnest(blocked_ids, blocked_keys) b(bid, k)
    WHERE t.id = b.bid;
  END IF;

  -- 5. A key woken here that still has room, whose woken rows this claim
  --    could not start (a paused queue, names or a timeout this pass does
  --    not take) and found none to wait again: its other waiting rows must
  --    not wait for a slot that no running task will give back. Look again
  --    at the next claim.
  IF cardinality(woken) > 0 THEN
    UPDATE outlive.limits l SET wake_at = '-infinity'
    WHERE l.key = ANY (woken) AND NOT (l.key = ANY (reblocked)) AND l.wake_at = 'infinity'
      AND (coalesce(l.concurrency, l.seen_concurrency) IS NULL OR l.running < coalesce(l.concurrency, l.seen_concurrency))
      AND (l.paused_until IS NULL OR l.paused_until <= t_now)
      AND EXISTS (SELECT 1 FROM outlive.tasks b WHERE b.blocked_on = l.key AND b.state = 'pending');
  END IF;

  RETURN QUERY
  UPDATE outlive.tasks t
  SET state = 'running',
      attempts = t.attempts + 1,
      lease_owner = owner,
      lease_expires_at = t_now + ((least(t.timeout_ms, lease_ms) + lease_grace_ms) * interval '1 millisecond'),
      started_at = t_now,
      updated_at = t_now
  WHERE t.id = ANY (picked) AND t.state = 'pending'
  RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text, t.fair_key, t.limits;
END;
$governed$;
--> statement-breakpoint
-- What a pass calls to claim (src/pass/claim.ts): governed rows through
-- outlive.claim_governed and the others through outlive.claim, each given
-- half the claim while both have work, the rest to whichever has more.
-- governed_limit caps the governed rows (NULL: no cap): a pass asks only for
-- as many as it has handlers free, because a governed task claimed into its
-- buffer would hold its keys' slots, its rate window and its fair turn
-- while it waits there. Three index probes decide whether there is governed
-- work at all, so a queue without flow control pays for them and nothing else.
CREATE FUNCTION "outlive"."claim_tasks"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[], governed_limit integer
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text,
  fair_key text, limits jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $tasks$
#variable_conflict use_column
DECLARE
  t_now timestamptz := coalesce(now_at, now());
  cap integer := least(claim_limit, coalesce(governed_limit, claim_limit));
  governed boolean := false;
  share integer := 0;
  got integer := 0;
  n integer;
BEGIN
  IF claim_limit <= 0 THEN RETURN; END IF;
  IF cap > 0 THEN
    governed := EXISTS (SELECT 1 FROM outlive.tasks t
                        WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL AND t.blocked_on IS NULL)
             OR EXISTS (SELECT 1 FROM outlive.tasks t
                        WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NULL AND t.run_at <= t_now)
             OR EXISTS (SELECT 1 FROM outlive.limits l WHERE l.wake_at <= t_now);
  END IF;
  IF governed THEN
    share := least((claim_limit + 1) / 2, cap);
    RETURN QUERY SELECT * FROM outlive.claim_governed(now_at, max_timeout_ms, queues, share, owner, lease_grace_ms, lease_ms, names, true);
    GET DIAGNOSTICS got = ROW_COUNT;
  END IF;
  -- A claim sized to free handlers is often all governed: no plain claim of 0.
  IF got >= claim_limit THEN RETURN; END IF;
  RETURN QUERY SELECT p.*, NULL::text, NULL::jsonb
    FROM outlive.claim(now_at, max_timeout_ms, queues, claim_limit - got, owner, lease_grace_ms, lease_ms, names) p;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF governed AND got = share AND got < cap AND got + n < claim_limit THEN
    RETURN QUERY SELECT * FROM outlive.claim_governed(now_at, max_timeout_ms, queues,
      least(claim_limit - got - n, cap - got), owner, lease_grace_ms, lease_ms, names, false);
  END IF;
END;
$tasks$;
--> statement-breakpoint
-- Debounce and throttle on idempotency keys (enqueue's keyMode, as
-- graphile-worker's job_key_mode): a pending task with the key takes the new
-- input (and, with 'replace', the new run_at: debounce; 'preserve_run_at'
-- keeps its time: throttle); a running one gives its key up to a new row,
-- so the new input runs after it. SECURITY DEFINER, so the app's role
-- needs no UPDATE on outlive.tasks (which would let it rewrite any row,
-- docs/shared-database.md): this function rewrites only the pending row of
-- the task name and key it is given. Its search_path is pinned like every
-- function's here.
CREATE FUNCTION "outlive"."enqueue_keyed"(
  task_name text, task_queue text, task_priority integer, task_max_attempts integer, task_timeout_ms integer,
  task_run_at timestamptz, inputs text[], keys text[], fair_keys text[], limit_sets text[], preserve_run_at boolean
) RETURNS TABLE (id text, queue text, state text, run_at timestamptz, key text, replaced boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $keyed$
#variable_conflict use_column
DECLARE
  i integer;
  tries integer;
  r record;
BEGIN
  FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
    FOR tries IN 1 .. 10 LOOP
      UPDATE outlive.tasks t
      SET input = inputs[i]::jsonb,
          run_at = CASE WHEN preserve_run_at THEN t.run_at ELSE task_run_at END,
          queue = task_queue, priority = task_priority, max_attempts = task_max_attempts, timeout_ms = task_timeout_ms,
          fair_key = fair_keys[i], limits = limit_sets[i]::jsonb,
          -- A row that keeps its time and turn keeps its place; any other is placed again when due.
          vt = CASE WHEN fair_keys[i] IS NOT NULL AND t.fair_key = fair_keys[i] AND t.queue = task_queue
                         AND (preserve_run_at OR task_run_at <= t.run_at) THEN t.vt END,
          blocked_on = NULL,
          updated_at = now()
      WHERE t.name = task_name AND t.key = keys[i] AND t.state = 'pending'
      RETURNING t.id::text AS tid, t.queue AS tq, t.state::text AS ts, t.run_at AS tr INTO r;
      IF FOUND THEN
        id := r.tid; queue := r.tq; state := r.ts; run_at := r.tr; key := keys[i]; replaced := true;
        RETURN NEXT;
        EXIT;
      END IF;
      UPDATE outlive.tasks t SET key = NULL, updated_at = now()
      WHERE t.name = task_name AND t.key = keys[i] AND t.state = 'running';
      INSERT INTO outlive.tasks AS t (name, queue, priority, max_attempts, timeout_ms, run_at, input, key, fair_key, limits, vt)
      VALUES (task_name, task_queue, task_priority, task_max_attempts, task_timeout_ms, task_run_at, inputs[i]::jsonb, keys[i],
              fair_keys[i], limit_sets[i]::jsonb,
              CASE WHEN fair_keys[i] IS NOT NULL AND task_run_at <= now() THEN (SELECT f.base FROM outlive.fair_start(task_queue, fair_keys[i]) f) END)
      ON CONFLICT (name, key) WHERE key IS NOT NULL AND state = ANY (ARRAY['pending', 'running']::outlive.task_state[])
      DO NOTHING
      RETURNING t.id::text AS tid, t.queue AS tq, t.state::text AS ts, t.run_at AS tr INTO r;
      IF FOUND THEN
        id := r.tid; queue := r.tq; state := r.ts; run_at := r.tr; key := keys[i]; replaced := false;
        RETURN NEXT;
        EXIT;
      END IF;
      -- Another transaction wrote the key in between: look again with a new snapshot.
      IF tries = 10 THEN
        RAISE EXCEPTION 'outlive: enqueue of "%": key % kept being taken and freed, 10 times; enqueue again', task_name, keys[i];
      END IF;
    END LOOP;
  END LOOP;
END;
$keyed$;
