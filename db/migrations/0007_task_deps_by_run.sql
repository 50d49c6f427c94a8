-- Dependency edges belong to their run: they are deleted with the run, not
-- with either task. The two foreign keys to outlive.tasks ran two cascade
-- queries for every tasks row deleted, whether it had edges or not (see
-- db/schema.ts). Every edge joins two steps of one run, so its run is its
-- task's run.
ALTER TABLE "outlive"."task_deps" ADD COLUMN "run_id" bigint;--> statement-breakpoint
UPDATE "outlive"."task_deps" d SET "run_id" = t."run_id" FROM "outlive"."tasks" t WHERE t."id" = d."task_id";--> statement-breakpoint
DELETE FROM "outlive"."task_deps" WHERE "run_id" IS NULL;--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" ALTER COLUMN "run_id" SET NOT NULL;--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" ADD CONSTRAINT "task_deps_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "outlive"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "task_deps_run_idx" ON "outlive"."task_deps" USING btree ("run_id");--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" DROP CONSTRAINT "task_deps_task_id_tasks_id_fk";--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" DROP CONSTRAINT "task_deps_depends_on_tasks_id_fk";
