-- Retention: the hourly purge. `done` rows go `done_retention` (14 d) after they
-- settled, `dead`, `failed` and `cancelled` rows `dead_retention` (90 d) after;
-- a live row (ready, delayed, running, suspended) never goes.

-- name: purge_jobs
-- Up to `limit` expired terminal rows, oldest first, with their step records
-- and any lease row left behind, in one statement. The rows are locked (SKIP
-- LOCKED: a requeue holding one keeps it) and the DELETE tests the state again,
-- so a row moved back to live between the pick and the delete stays. SKIP
-- LOCKED never waits for a row, so the purge needs no lock order; the step and
-- lease rows it deletes belong to rows it holds.
WITH doomed AS (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.state IN ('done', 'failed', 'dead', 'cancelled')
      AND j.updated_at < CASE WHEN j.state = 'done' THEN %(done_before)s::float8
                              ELSE %(dead_before)s::float8 END
    ORDER BY j.updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM trio_jobs_jobs j USING doomed d
    WHERE j.id = d.id AND j.state IN ('done', 'failed', 'dead', 'cancelled')
    RETURNING j.id
),
steps AS (
    DELETE FROM trio_jobs_steps s USING gone g WHERE s.job_id = g.id
),
leases AS (
    DELETE FROM trio_jobs_leases s USING gone g WHERE s.job_id = g.id
)
SELECT count(*) FROM gone;
