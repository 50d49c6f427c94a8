-- Vacuum outlive.tasks early and often. Every claim and settle writes a new
-- row version, so a busy queue makes dead tuples fast; measured under load
-- (docs/reliability.md), the server defaults let ~100,000 pile up between
-- vacuums. These settings are per table, cheap, and undone with RESET.
-- (At several hundred tasks/s, autovacuum_naptime = 10s, a server-wide
-- setting for the operator, is what brings dead tuples down to thousands.)
ALTER TABLE "outlive"."tasks" SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
