-- Attempts the handler did not spend (issue 27). An attempt cut short by its
-- pass (it died, or lost its lease) is an interruption: recovery adds one to
-- `interruptions` (src/pass/recover.ts). An attempt that said "not yet"
-- (SnoozeError) adds one to `snoozes` (src/pass/settle.ts). Either adds one
-- to `max_attempts` too, so neither spends an attempt the task declared, and
-- attempt numbers stay unique for what is matched on them (settles, a rate's
-- starts). The check keeps the one attempt every task declares at least.
-- Validated after it is added: VALIDATE reads the table without blocking
-- writes to it. `progress` is what a running attempt last reported
-- (`ctx.progress`, written at most once a second by src/pass/execute.ts).
ALTER TABLE "outlive"."tasks" ADD COLUMN "interruptions" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "snoozes" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD COLUMN "progress" jsonb;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" ADD CONSTRAINT "tasks_unspent_attempts_check" CHECK ("outlive"."tasks"."interruptions" >= 0 AND "outlive"."tasks"."snoozes" >= 0 AND "outlive"."tasks"."max_attempts" - "outlive"."tasks"."interruptions" - "outlive"."tasks"."snoozes" >= 1) NOT VALID;--> statement-breakpoint
ALTER TABLE "outlive"."tasks" VALIDATE CONSTRAINT "tasks_unspent_attempts_check";
