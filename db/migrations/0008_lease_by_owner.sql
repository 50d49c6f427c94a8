-- Running rows by lease owner, then expiry (see db/schema.ts). Settles and
-- heartbeats name their pass's owner, so they read that pass's rows only,
-- however many other passes have running; recovery reads the running rows'
-- entries for expired leases. The build reads every row of outlive.tasks
-- under a write lock, but writes entries only for running rows.
DROP INDEX "outlive"."tasks_lease_idx";--> statement-breakpoint
CREATE INDEX "tasks_lease_idx" ON "outlive"."tasks" USING btree ("lease_owner","lease_expires_at") WHERE "outlive"."tasks"."state" = 'running';