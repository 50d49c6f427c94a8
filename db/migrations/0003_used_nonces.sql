CREATE TABLE "outlive"."used_nonces" (
	"nonce" text PRIMARY KEY NOT NULL,
	"expires_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE INDEX "used_nonces_expires_idx" ON "outlive"."used_nonces" USING btree ("expires_at");