ALTER TABLE "outlive"."tasks" ADD COLUMN "trace_context" text;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_trace_context_check" CHECK (pg_catalog.length("outlive"."tasks"."trace_context") <= 1024);--> statement-breakpoint
-- enqueue_keyed writes the enqueue's trace context too (a row rewritten by
-- debounce takes the latest enqueue's, whose span its attempt then links
-- to). A new parameter makes a new function, so the old one is dropped.
DROP FUNCTION "outlive"."enqueue_keyed"(text, text, integer, integer, integer, timestamptz, text[], text[], text[], text[], boolean);
--> statement-breakpoint
CREATE FUNCTION "outlive"."enqueue_keyed"(
  task_name text, task_queue text, task_priority integer, task_max_attempts integer, task_timeout_ms integer,
  task_run_at timestamptz, inputs text[], keys text[], fair_keys text[], limit_sets text[], preserve_run_at boolean, trace text
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
          trace_context = trace,
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
      INSERT INTO outlive.tasks AS t (name, queue, priority, max_attempts, timeout_ms, run_at, input, key, fair_key, limits, vt, trace_context)
      VALUES (task_name, task_queue, task_priority, task_max_attempts, task_timeout_ms, task_run_at, inputs[i]::jsonb, keys[i],
              fair_keys[i], limit_sets[i]::jsonb,
              CASE WHEN fair_keys[i] IS NOT NULL AND task_run_at <= now() THEN (SELECT f.base FROM outlive.fair_start(task_queue, fair_keys[i]) f) END,
              trace)
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
