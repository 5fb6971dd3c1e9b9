-- 0011: an ack no longer rewrites the attempt log. A done row's last entry is
-- left open by the ack (the jsonb rewrite cost ~6 us of server CPU a job, a
-- tenth of a no-op job's); every reader closes it with the row's settle time
-- and outcome through trio_jobs_attempt_read, and a requeue of a done row
-- closes it for good before the row lives again. Rows acked before 0011 carry
-- a closed entry already: the read leaves a closed entry alone.
CREATE FUNCTION trio_jobs_attempt_read(log jsonb, state text, settled_at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN state = 'done' THEN trio_jobs_attempt_end(log, settled_at, 'done', NULL, NULL)
                ELSE log END
$$;
