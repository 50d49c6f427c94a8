-- What each pass can give: the longest timeout a pass that knows a task name
-- can claim (its budget less its reserve), so that a ready task longer than
-- that is reported as one no pass can run, not as one waiting its turn.
-- Null until a pass of this release announces the name; rows written by
-- passes of the previous release during a rolling deploy stay null.
ALTER TABLE "outlive"."known_tasks" ADD COLUMN "longest_ms" integer;--> statement-breakpoint
ALTER TABLE "outlive"."known_tasks" ADD COLUMN "longest_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "outlive"."known_tasks" ADD CONSTRAINT "known_tasks_longest_check" CHECK (("outlive"."known_tasks"."longest_ms" IS NULL) = ("outlive"."known_tasks"."longest_at" IS NULL) AND "outlive"."known_tasks"."longest_ms" > 0);