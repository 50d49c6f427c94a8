CREATE SCHEMA IF NOT EXISTS "outlive";
--> statement-breakpoint
CREATE TYPE "outlive"."run_state" AS ENUM('running', 'succeeded', 'failed', 'cancelled');--> statement-breakpoint
CREATE TYPE "outlive"."task_state" AS ENUM('pending', 'running', 'succeeded', 'failed', 'cancelled', 'skipped');--> statement-breakpoint
CREATE TABLE "outlive"."runs" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"state" "outlive"."run_state" DEFAULT 'running' NOT NULL,
	"unfinished" integer DEFAULT 0 NOT NULL,
	"failed_task_id" bigint,
	"error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "outlive"."task_deps" (
	"task_id" bigint NOT NULL,
	"depends_on" bigint NOT NULL,
	CONSTRAINT "task_deps_task_id_depends_on_pk" PRIMARY KEY("task_id","depends_on")
);
--> statement-breakpoint
CREATE TABLE "outlive"."tasks" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"queue" text DEFAULT 'default' NOT NULL,
	"state" "outlive"."task_state" DEFAULT 'pending' NOT NULL,
	"priority" integer DEFAULT 0 NOT NULL,
	"input" jsonb NOT NULL,
	"output" jsonb,
	"attempts" integer DEFAULT 0 NOT NULL,
	"max_attempts" integer NOT NULL,
	"run_at" timestamp with time zone DEFAULT now() NOT NULL,
	"timeout_ms" integer NOT NULL,
	"lease_owner" text,
	"lease_expires_at" timestamp with time zone,
	"key" text,
	"last_error" text,
	"errors" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"run_id" bigint,
	"step" text,
	"waiting_on" integer DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone,
	"finished_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" ADD CONSTRAINT "task_deps_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "outlive"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "outlive"."task_deps" ADD CONSTRAINT "task_deps_depends_on_tasks_id_fk" FOREIGN KEY ("depends_on") REFERENCES "outlive"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "outlive"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "runs_created_idx" ON "outlive"."runs" USING btree ("created_at");--> statement-breakpoint
CREATE INDEX "task_deps_depends_on_idx" ON "outlive"."task_deps" USING btree ("depends_on");--> statement-breakpoint
CREATE INDEX "tasks_claim_idx" ON "outlive"."tasks" USING btree ("priority" DESC NULLS LAST,"run_at","id") WHERE "outlive"."tasks"."state" = 'pending' AND "outlive"."tasks"."waiting_on" = 0;--> statement-breakpoint
CREATE INDEX "tasks_lease_idx" ON "outlive"."tasks" USING btree ("lease_expires_at") WHERE "outlive"."tasks"."state" = 'running';--> statement-breakpoint
CREATE UNIQUE INDEX "tasks_key_idx" ON "outlive"."tasks" USING btree ("name","key") WHERE "outlive"."tasks"."key" IS NOT NULL AND "outlive"."tasks"."state" IN ('pending', 'running');--> statement-breakpoint
CREATE UNIQUE INDEX "tasks_run_step_idx" ON "outlive"."tasks" USING btree ("run_id","step");--> statement-breakpoint
CREATE INDEX "tasks_state_finished_idx" ON "outlive"."tasks" USING btree ("state","finished_at") WHERE "outlive"."tasks"."finished_at" IS NOT NULL;