-- A fairness key's last turn is read from an index the queue's head index
-- cannot stand in for. Before, both indexes had the same predicate, and the
-- plan of outlive.fair_start (a SQL function: planned without its
-- arguments' values) took the head index backwards whenever the statistics
-- said one key held most ready rows, filtering by key: the enqueue of a
-- key with no ready rows behind 100,000 of another key's read all 100,000
-- (28 ms). The key's index now leaves out no unplaced rows (vt null, last
-- in its order), and the key's probe does not say vt IS NOT NULL, so only
-- that index answers it: two index probes, whatever the backlog.
CREATE INDEX "tasks_fair_key_last_idx" ON "outlive"."tasks" USING btree ("queue","fair_key","vt" DESC NULLS LAST) WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."fair_key" IS NOT NULL;--> statement-breakpoint
DROP INDEX "outlive"."tasks_fair_last_idx";--> statement-breakpoint
CREATE OR REPLACE FUNCTION "outlive"."fair_start"(q text, k text, OUT base double precision, OUT step double precision)
LANGUAGE sql STABLE
SET jit = off
SET search_path = pg_catalog, pg_temp
AS $fair$
  SELECT coalesce(
           (SELECT t.vt FROM outlive.tasks t
            WHERE t.state = 'pending' AND t.queue = q AND t.fair_key = k
            ORDER BY t.queue, t.fair_key, t.vt DESC NULLS LAST LIMIT 1) + w.step,
           (SELECT t.vt FROM outlive.tasks t
            WHERE t.state = 'pending' AND t.queue = q AND t.fair_key IS NOT NULL AND t.vt IS NOT NULL
            ORDER BY t.queue, t.vt LIMIT 1),
           0),
         w.step
  FROM (SELECT 1.0 / coalesce((SELECT f.weight FROM outlive.fairness f WHERE f.queue = q AND f.key = k), 1) AS step) w
$fair$;
