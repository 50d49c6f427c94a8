-- Wake-up: every statement that inserts ready tasks fires one NOTIFY per queue
-- on the channel "outlive". A NOTIFY is delivered only when its transaction
-- commits, so a rolled-back enqueue wakes nobody, and Postgres folds identical
-- notifications of one transaction into one, so a bulk insert wakes a listener
-- once, not once per row.
CREATE FUNCTION "outlive"."notify_ready"() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  q text;
BEGIN
  FOR q IN SELECT DISTINCT queue FROM new_rows WHERE state = 'pending' AND waiting_on = 0 LOOP
    PERFORM pg_notify('outlive', q);
  END LOOP;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE TRIGGER "tasks_notify_insert" AFTER INSERT ON "outlive"."tasks"
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION "outlive"."notify_ready"();
