-- Steps stay unique within a run; tasks outside runs leave the index, so
-- their claims and settles no longer add an entry to it (see db/schema.ts).
-- The build holds a write lock on outlive.tasks for as long as it takes
-- (it reads every row); on a large table, run it when the queue is quiet.
DROP INDEX "outlive"."tasks_run_step_idx";--> statement-breakpoint
CREATE UNIQUE INDEX "tasks_run_step_idx" ON "outlive"."tasks" USING btree ("run_id","step") WHERE "outlive"."tasks"."run_id" IS NOT NULL;