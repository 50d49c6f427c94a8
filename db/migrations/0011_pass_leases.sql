CREATE TABLE "outlive"."leases" (
	"owner" text PRIMARY KEY NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
-- Nothing running is rewritten: a row claimed before this migration keeps the
-- lease its pass wrote into it. A pass of the previous release goes on
-- extending its rows' own leases during a rolling deploy, and a row whose
-- pass died is recovered once that lease expires, as before; a pass of this
-- release holds its rows through one row here. A running task is held while
-- either lease lives (RECOVER_SQL in src/pass/recover.ts). The other way
-- round, a pass of the previous release knows nothing of this table: while
-- both releases run, its recovery may hand back a task of this release
-- running past its claim-time lease (at most leaseMs + grace), which then
-- runs again and its first result is dropped, as for any lost lease.
COMMENT ON TABLE "outlive"."leases" IS 'One row per pass holding tasks past their claim-time lease; a running task is held while its own lease or its pass''s lease lives.';
