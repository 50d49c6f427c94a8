CREATE TABLE "outlive"."schedule_slots" (
	"schedule" text NOT NULL,
	"slot" timestamp with time zone NOT NULL,
	"task_id" bigint,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "schedule_slots_schedule_slot_pk" PRIMARY KEY("schedule","slot")
);
--> statement-breakpoint
CREATE TABLE "outlive"."schedules" (
	"name" text PRIMARY KEY NOT NULL,
	"cron" text NOT NULL,
	"timezone" text DEFAULT 'UTC' NOT NULL,
	"task" text NOT NULL,
	"next_slot" timestamp with time zone NOT NULL,
	"last_slot" timestamp with time zone,
	"last_fired_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE INDEX "schedule_slots_slot_idx" ON "outlive"."schedule_slots" USING btree ("slot");