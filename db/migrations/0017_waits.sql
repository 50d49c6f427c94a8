-- Waits and signals (issue 27). A step made by waitFor or sleepStep is a row
-- of the built-in task '$wait' (src/model/wait.ts). A pass that claims one
-- calls outlive.begin_waits, which ends it with the signal it already has or
-- a kept one, ends it at its deadline, or parks it: pending again with
-- run_at at its deadline and wait_key set, holding no lease, so nothing
-- reads or writes it until outlive.send_signal wakes it or the claim finds
-- it due. Both functions take a transaction-scoped advisory lock per key
-- before they read, and each statement after the lock reads a fresh
-- snapshot (plpgsql in READ COMMITTED), so a signal and a wait on one key
-- never both miss each other: the second to lock sees what the first wrote.
-- A signal that finds waits parked settles them itself, in its own
-- transaction, through the statements a pass's settle applies to a run
-- (outlive.release_dependents, outlive.finish_runs, called by
-- src/pass/run-effects.ts too), so the step after a wait is ready the moment
-- the signal commits.
CREATE TABLE "outlive"."signals" (
	"key" text NOT NULL,
	"id" text NOT NULL,
	"payload" jsonb,
	"sent_at" timestamp with time zone DEFAULT now() NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	"consumed_at" timestamp with time zone,
	"delivered" integer DEFAULT 0 NOT NULL,
	CONSTRAINT "signals_key_id_pk" PRIMARY KEY("key","id"),
	CONSTRAINT "signals_delivered_check" CHECK ("outlive"."signals"."delivered" >= 0 AND ("outlive"."signals"."consumed_at" IS NULL) = ("outlive"."signals"."delivered" = 0))
);
--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "wait_key" text;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "wait_until" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "signal" jsonb;--> statement-breakpoint
CREATE INDEX "signals_kept_idx" ON "outlive"."signals" USING btree ("key","sent_at","id") WHERE "outlive"."signals"."consumed_at" IS NULL;--> statement-breakpoint
CREATE INDEX "signals_expires_idx" ON "outlive"."signals" USING btree ("expires_at");--> statement-breakpoint
CREATE INDEX "tasks_wait_idx" ON "outlive"."tasks" USING btree ("wait_key") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."wait_key" IS NOT NULL;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_wait_check" CHECK ("outlive"."tasks"."name" = '$wait' OR ("outlive"."tasks"."wait_key" IS NULL AND "outlive"."tasks"."wait_until" IS NULL AND "outlive"."tasks"."signal" IS NULL)) NOT VALID;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" VALIDATE CONSTRAINT "tasks_wait_check";--> statement-breakpoint
CREATE FUNCTION "outlive"."signal_lock"(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.hashtextextended('outlive.signal:' OPERATOR(pg_catalog.||) key, 0) $$;--> statement-breakpoint
CREATE FUNCTION "outlive"."release_dependents"(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (ready integer, notified integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- Each dependent once per dependency that just succeeded, locked in id
  -- order; the NOTIFY wakes listening workers for the tasks this made ready.
  RETURN QUERY
  WITH c AS (
    SELECT d.task_id, pg_catalog.count(*)::int AS n FROM outlive.task_deps d WHERE d.depends_on = ANY (p_ids) GROUP BY d.task_id
  ), locked AS (
    SELECT t.id, c.n FROM outlive.tasks t JOIN c ON c.task_id = t.id
    WHERE t.state = 'pending' ORDER BY t.id FOR UPDATE OF t
  ), upd AS (
    UPDATE outlive.tasks t SET waiting_on = t.waiting_on - locked.n, updated_at = coalesce(p_now, now())
    FROM locked WHERE t.id = locked.id
    RETURNING t.queue, t.waiting_on
  )
  SELECT pg_catalog.count(*) FILTER (WHERE upd.waiting_on = 0)::int,
         (SELECT pg_catalog.count(pg_catalog.pg_notify('outlive', q.queue))
          FROM (SELECT DISTINCT u.queue FROM upd u WHERE u.waiting_on = 0) q)::int
  FROM upd;
END
$$;--> statement-breakpoint
-- Each run's count of unfinished tasks moved by its delta, its first failed
-- task kept, and its final state taken when the count reaches 0; runs in id
-- order, after their tasks.
CREATE FUNCTION "outlive"."finish_runs"(p_now timestamptz, p_ids bigint[], p_deltas integer[], p_failed bigint[], p_errors text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE outlive.runs r
  SET unfinished = r.unfinished + d.delta,
      failed_task_id = coalesce(r.failed_task_id, d.failed_task_id),
      error = coalesce(r.error, d.error),
      state = CASE WHEN r.state = 'running' AND (r.unfinished + d.delta) <= 0
                   THEN CASE WHEN coalesce(r.failed_task_id, d.failed_task_id) IS NULL THEN 'succeeded' ELSE 'failed' END::outlive.run_state
                   ELSE r.state END,
      finished_at = CASE WHEN r.state = 'running' AND (r.unfinished + d.delta) <= 0 THEN coalesce(p_now, now()) ELSE r.finished_at END,
      updated_at = coalesce(p_now, now())
  FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_deltas), pg_catalog.unnest(p_failed), pg_catalog.unnest(p_errors))
       AS d(id, delta, failed_task_id, error)
  WHERE r.id = d.id;
END
$$;--> statement-breakpoint
-- A signal: kept under (key, id), so the same id again changes nothing;
-- it ends every wait parked on its key, or is kept until expires_at for the
-- first wait on the key to begin.
CREATE FUNCTION "outlive"."send_signal"(p_key text, p_id text, p_payload jsonb, p_keep_ms bigint)
RETURNS TABLE (delivered integer, duplicate boolean)
LANGUAGE plpgsql
-- As the schema's owner, so the app's role signals without the right to update tasks or read signals.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  n integer;
  ids bigint[];
  runs bigint[];
  deltas integer[];
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(outlive.signal_lock(p_key));
  INSERT INTO outlive.signals (key, id, payload, sent_at, expires_at)
  VALUES (p_key, p_id, p_payload, now(), now() + p_keep_ms * interval '1 millisecond')
  ON CONFLICT (key, id) DO NOTHING;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 0, true;
    RETURN;
  END IF;
  -- The parked waits of the key, locked in id order as settles lock them,
  -- settled with the payload; then their runs move on as a pass's settle moves them.
  WITH locked AS (
    SELECT t.id FROM outlive.tasks t
    WHERE t.wait_key = p_key AND t.state = 'pending' AND t.signal IS NULL
    ORDER BY t.id FOR UPDATE
  ), done AS (
    UPDATE outlive.tasks t
    SET state = 'succeeded', output = p_payload, signal = pg_catalog.jsonb_build_object('id', p_id, 'payload', p_payload),
        finished_at = now(), updated_at = now()
    FROM locked WHERE t.id = locked.id AND t.state = 'pending'
    RETURNING t.id, t.run_id
  ), per_run AS (
    SELECT d.run_id, pg_catalog.count(*)::int AS n FROM done d WHERE d.run_id IS NOT NULL GROUP BY d.run_id
  )
  SELECT (SELECT pg_catalog.count(*)::int FROM done),
         (SELECT coalesce(pg_catalog.array_agg(d.id ORDER BY d.id), '{}') FROM done d),
         (SELECT coalesce(pg_catalog.array_agg(p.run_id ORDER BY p.run_id), '{}') FROM per_run p),
         (SELECT coalesce(pg_catalog.array_agg(-p.n ORDER BY p.run_id), '{}') FROM per_run p)
  INTO n, ids, runs, deltas;
  IF n > 0 THEN
    PERFORM * FROM outlive.release_dependents(ids, now());
    IF pg_catalog.cardinality(runs) > 0 THEN
      PERFORM outlive.finish_runs(now(), runs, deltas, pg_catalog.array_fill(NULL::bigint, ARRAY[pg_catalog.cardinality(runs)]),
                                  pg_catalog.array_fill(NULL::text, ARRAY[pg_catalog.cardinality(runs)]));
    END IF;
    UPDATE outlive.signals SET consumed_at = now(), delivered = n WHERE key = p_key AND id = p_id;
  END IF;
  RETURN QUERY SELECT n, false;
END
$$;--> statement-breakpoint
-- The waits a pass claimed, begun: each running row of the pass's owner and
-- attempt takes the oldest kept signal of its key (one signal, one wait), and
-- is then ended by its signal ('signal'), ended at its deadline ('timeout'),
-- or parked until it ('park', no attempt spent: snoozes and max_attempts + 1
-- as a snooze). The deadline is fixed when it first parks (wait_until); a
-- sleep's is its time. Ended waits stay running for the pass to settle;
-- rows no longer the pass's are left out.
CREATE FUNCTION "outlive"."begin_waits"(p_ids bigint[], p_attempts integer[], p_owner text, p_now timestamptz)
RETURNS TABLE (id text, outcome text, payload jsonb, deadline timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  now_ts timestamptz := coalesce(p_now, now());
BEGIN
  -- Locked in one order, so two passes beginning waits on the same keys queue up rather than deadlock.
  PERFORM pg_catalog.pg_advisory_xact_lock(l.h)
  FROM (SELECT DISTINCT outlive.signal_lock(t.input ->> 'key') AS h
        FROM outlive.tasks t JOIN ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_attempts)) AS c(id, attempt) ON t.id = c.id
        WHERE t.state = 'running' AND t.attempts = c.attempt AND t.lease_owner = p_owner AND t.signal IS NULL AND t.input ? 'key'
        ORDER BY 1) l;
  WITH mine AS (
    SELECT t.id, t.input ->> 'key' AS key, pg_catalog.row_number() OVER (PARTITION BY t.input ->> 'key' ORDER BY t.id) AS rn
    FROM outlive.tasks t JOIN ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_attempts)) AS c(id, attempt) ON t.id = c.id
    WHERE t.state = 'running' AND t.attempts = c.attempt AND t.lease_owner = p_owner AND t.signal IS NULL AND t.input ? 'key'
  ), kept AS (
    SELECT s.key, s.id, s.payload, pg_catalog.row_number() OVER (PARTITION BY s.key ORDER BY s.sent_at, s.id) AS rn
    FROM outlive.signals s
    WHERE s.key IN (SELECT m.key FROM mine m) AND s.consumed_at IS NULL AND s.expires_at > now()
  ), matched AS (
    SELECT m.id AS task_id, k.key, k.id AS signal_id, k.payload FROM mine m JOIN kept k ON k.key = m.key AND k.rn = m.rn
  ), took AS (
    UPDATE outlive.signals s SET consumed_at = now(), delivered = 1
    FROM matched m WHERE s.key = m.key AND s.id = m.signal_id AND s.consumed_at IS NULL
  )
  UPDATE outlive.tasks t SET signal = pg_catalog.jsonb_build_object('id', m.signal_id, 'payload', m.payload), updated_at = now_ts
  FROM matched m WHERE t.id = m.task_id;

  RETURN QUERY
  WITH mine AS (
    SELECT t.id, t.signal, t.input,
           coalesce(t.wait_until,
                    CASE WHEN t.input ? 'until' THEN (t.input ->> 'until')::timestamptz
                         ELSE now_ts + (coalesce(t.input ->> 'timeoutMs', t.input ->> 'ms'))::bigint * interval '1 millisecond' END) AS deadline
    FROM outlive.tasks t JOIN ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_attempts)) AS c(id, attempt) ON t.id = c.id
    WHERE t.state = 'running' AND t.attempts = c.attempt AND t.lease_owner = p_owner
    FOR UPDATE OF t
  ), decided AS (
    SELECT m.id, m.signal, m.input, m.deadline,
           CASE WHEN m.signal IS NOT NULL THEN 'signal' WHEN m.deadline <= now_ts THEN 'timeout' ELSE 'park' END AS outcome
    FROM mine m
  ), parked AS (
    UPDATE outlive.tasks t
    SET state = 'pending', run_at = d.deadline, wait_key = d.input ->> 'key', wait_until = d.deadline,
        lease_owner = NULL, lease_expires_at = NULL, snoozes = t.snoozes + 1, max_attempts = t.max_attempts + 1, updated_at = now_ts
    FROM decided d WHERE t.id = d.id AND d.outcome = 'park'
  )
  SELECT d.id::text, d.outcome, d.signal -> 'payload', d.deadline FROM decided d;
END
$$;