-- A claim with flow control locked ten rows in turn for each it took: a
-- PL/pgSQL FOR loop over a query fetches ten rows at a time, and under FOR
-- UPDATE SKIP LOCKED each fetched row is locked until the claim commits, so
-- a concurrent claim skipped the nine not taken and started rows behind
-- them (a newcomer's task next in turn waited ~20 claims under load;
-- docs/benchmarks.md, "Fairness"). The admitting loop now fetches from a
-- cursor one row at a time and stops before fetching past what it takes.
CREATE OR REPLACE FUNCTION "outlive"."claim_governed"(
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
  RETURNING t.id::text, t.name, t.queue, t.input, t.attempts, t.max_attempts, t.timeout_ms, t.run_id::text, t.fair_key, t.limits;
END;
$governed$;
