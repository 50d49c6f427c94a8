p='src/pass/recover.ts'
s=open(p).read()
old_exp="""WITH expired AS (
  SELECT t.id FROM outlive.tasks t
"""
new_exp="""WITH expired AS (
  SELECT t.id,
         t.max_attempts OPERATOR(pg_catalog.=) 1 OR t.interruptions OPERATOR(pg_catalog.>=) $3 AS spent,
         'lease expired: the pass running attempt ' OPERATOR(pg_catalog.||) t.attempts OPERATOR(pg_catalog.||) ' stopped before settling it' OPERATOR(pg_catalog.||)
         CASE WHEN t.max_attempts OPERATOR(pg_catalog.=) 1 THEN ' (maxAttempts 1: not run again)'
              WHEN t.interruptions OPERATOR(pg_catalog.>=) $3 THEN ' (interrupted ' OPERATOR(pg_catalog.||) (t.interruptions OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.||) ' times, more than ' OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) ')'
              ELSE ' (interruption ' OPERATOR(pg_catalog.||) (t.interruptions OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.||) ' of ' OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) ', not counted as an attempt)' END AS message
  FROM outlive.tasks t
"""
assert old_exp in s
s=s.replace(old_exp,new_exp)
old=s[s.index("recovered AS (\nUPDATE outlive.tasks t"):s.index("FROM expired\nWHERE t.id OPERATOR(pg_catalog.=) expired.id")]
new="""recovered AS (
UPDATE outlive.tasks t
SET state = CASE WHEN expired.spent THEN 'failed' ELSE 'pending' END::outlive.task_state,
    interruptions = CASE WHEN expired.spent THEN t.interruptions ELSE t.interruptions OPERATOR(pg_catalog.+) 1 END,
    max_attempts = CASE WHEN expired.spent THEN t.max_attempts ELSE t.max_attempts OPERATOR(pg_catalog.+) 1 END,
    run_at = CASE WHEN expired.spent THEN t.run_at
                  ELSE coalesce($1::timestamptz, pg_catalog.now()) OPERATOR(pg_catalog.+)
                       (least(3600000, 1000 OPERATOR(pg_catalog.*) (2 OPERATOR(pg_catalog.^) least(t.interruptions, 30)))
                        OPERATOR(pg_catalog.*) interval '1 millisecond') END,
    last_error = expired.message,
    errors = t.errors OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
      'attempt', t.attempts,
      'at', coalesce($1::timestamptz, pg_catalog.now()),
      'name', 'LeaseExpired',
      'message', expired.message)),
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = CASE WHEN expired.spent THEN coalesce($1::timestamptz, pg_catalog.now()) END,
    vt = NULL,
    blocked_on = NULL,
    updated_at = coalesce($1::timestamptz, pg_catalog.now())
"""
s=s.replace(old,new)
open(p,'w').write(s)
