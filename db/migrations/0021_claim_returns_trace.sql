-- The claims return what an attempt's span and metrics need of its row
-- (the enqueue's trace context, the step, how long it waited to start),
-- so a traced pass no longer reads each claim's rows back
-- (docs/benchmarks.md, "Tracing: what outlive/otel costs a drain"). The
-- bodies are those of 0014 and 0018 with three more columns returned. A
-- function's columns cannot be changed in place, so each is dropped and
-- made again, keeping the EXECUTE grants it had (`outlive grants`): a
-- migrate not followed by grants must neither lock the worker's role out
-- nor open the claims to PUBLIC.
CREATE TEMP TABLE outlive_0021_acl ON COMMIT DROP AS
  SELECT p.oid::regprocedure::text AS sig, p.proacl FROM pg_catalog.pg_proc p
  WHERE p.oid IN ('outlive.claim(timestamptz, integer, text[], integer, text, integer, integer, text[])'::regprocedure,
                  'outlive.claim_governed(timestamptz, integer, text[], integer, text, integer, integer, text[], boolean)'::regprocedure,
                  'outlive.claim_tasks(timestamptz, integer, text[], integer, text, integer, integer, text[], integer)'::regprocedure);--> statement-breakpoint
DROP FUNCTION outlive.claim_tasks(timestamptz, integer, text[], integer, text, integer, integer, text[], integer);--> statement-breakpoint
DROP FUNCTION outlive.claim_governed(timestamptz, integer, text[], integer, text, integer, integer, text[], boolean);--> statement-breakpoint
DROP FUNCTION outlive.claim(timestamptz, integer, text[], integer, text, integer, integer, text[]);--> statement-breakpoint
-- The plain claim: CLAIM_SQL of src/pass/claim.ts, character for character
-- (test/claim.test.ts). The start latency is for a task on its own; a
-- step's due time is its release, which is not kept. date_part, not
-- extract: float8 arithmetic is cheaper than numeric on the claim's path.
CREATE FUNCTION "outlive"."claim"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[]
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text,
  trace_context text, step text, start_latency_ms double precision
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
RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text,
  t.trace_context, t.step,
  CASE WHEN t.run_id IS NULL THEN pg_catalog.date_part('epoch', coalesce($1::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.-) t.run_at) OPERATOR(pg_catalog.*) 1000 END;
END;
$claim$;
--> statement-breakpoint
CREATE FUNCTION "outlive"."claim_governed"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[], write_keys boolean
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text,
  fair_key text, limits jsonb, trace_context text, step text, start_latency_ms double precision
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
  next_ms double precision;
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
  admit refcursor;
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

  -- 4. Admit in turn, one fetched (and locked) row at a time.
  OPEN admit NO SCROLL FOR
    SELECT t.id AS tid, t.limits AS tl, t.attempts AS ta FROM outlive.tasks t
    WHERE t.state = 'pending' AND t.waiting_on = 0 AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL AND t.blocked_on IS NULL
      AND t.run_at <= t_now AND t.timeout_ms <= max_timeout_ms
      AND (queues IS NULL OR t.queue = ANY (queues)) AND t.name = ANY (names) AND t.queue <> ALL (paused)
    ORDER BY t.priority DESC NULLS LAST, t.vt, t.id
    FOR UPDATE OF t SKIP LOCKED;
  WHILE cardinality(picked) < claim_limit AND examined < claim_limit * 4 + 20 LOOP
    FETCH admit INTO c;
    EXIT WHEN NOT FOUND;
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
        next_ms := outlive.rate_next_start(kr.starts, lim, coalesce(kr.rate_period_ms, (e->>'p')::double precision),
                                           coalesce((e->>'c')::double precision, 1), (e->>'b')::double precision, now_ms);
        IF next_ms > now_ms THEN
          block_key := kr.lkey;
          block_until := to_timestamp(next_ms / 1000);  -- 'infinity' when no start ever fits
          EXIT;
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
  CLOSE admit;

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
  RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text, t.fair_key, t.limits,
    t.trace_context, t.step,
    CASE WHEN t.run_id IS NULL THEN date_part('epoch', t_now - t.run_at) * 1000 END;
END;
$governed$;
--> statement-breakpoint
CREATE FUNCTION "outlive"."claim_tasks"(
  now_at timestamptz, max_timeout_ms integer, queues text[], claim_limit integer,
  owner text, lease_grace_ms integer, lease_ms integer, names text[], governed_limit integer
) RETURNS TABLE (
  id text, name text, queue text, input jsonb, attempts integer, max_attempts integer, timeout_ms integer, run_id text,
  fair_key text, limits jsonb, trace_context text, step text, start_latency_ms double precision
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
  RETURN QUERY SELECT p.id, p.name, p.queue, p.input, p.attempts, p.max_attempts, p.timeout_ms, p.run_id, NULL::text, NULL::jsonb,
      p.trace_context, p.step, p.start_latency_ms
    FROM outlive.claim(now_at, max_timeout_ms, queues, claim_limit - got, owner, lease_grace_ms, lease_ms, names) p;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF governed AND got = share AND got < cap AND got + n < claim_limit THEN
    RETURN QUERY SELECT * FROM outlive.claim_governed(now_at, max_timeout_ms, queues,
      least(claim_limit - got - n, cap - got), owner, lease_grace_ms, lease_ms, names, false);
  END IF;
END;
$tasks$;
--> statement-breakpoint
DO $acl$
DECLARE
  f record;
  g record;
BEGIN
  FOR f IN SELECT a.sig, a.proacl FROM outlive_0021_acl a WHERE a.proacl IS NOT NULL LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
    FOR g IN SELECT x.grantee FROM pg_catalog.aclexplode(f.proacl) x WHERE x.privilege_type = 'EXECUTE' LOOP
      IF g.grantee = 0 THEN
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f.sig);
      ELSE
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig, g.grantee::regrole);
      END IF;
    END LOOP;
  END LOOP;
END;
$acl$;
