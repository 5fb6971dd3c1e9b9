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
-- The same statement deletes up to `limit` rate-limit rows that hold nothing
-- any more (0010: `expires_at` passed on the database's clock: the last grant
-- left its window and the last promise of its queue passed), so the sweep costs
-- no statement of its own. An acquirer holding the row keeps it (SKIP LOCKED),
-- and the DELETE tests `expires_at` again on the row it locked: one an
-- acquisition renewed meanwhile stays. (The rest of a longer list goes at the
-- next sweep.)
-- Done rows come through the listing index (created_at, id), oldest first: a
-- done row settled before the cut was created before it (0021: an ack enters
-- no retention index); the others through the retention index, oldest settled
-- first, up to what the done rows left of `limit`.
-- Each batch of a sweep starts where the one before stopped (`after_*`, the
-- last row it deleted; NULL for a sweep's first batch): the rows a sweep
-- deleted stay in the indexes as dead entries until a vacuum, and a batch that
-- started from the oldest entry again stepped over all of them, so a sweep of a
-- big backlog slowed with every batch (10 million rows: 5,400 rows/s for the
-- first three million, 900 after four). A row SKIP LOCKED passed goes at the
-- next sweep.
WITH done AS (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.created_at < %(done_before)s::float8
      AND (j.created_at, j.id) > (coalesce(%(after_created)s::float8, '-Infinity'::float8),
          coalesce(%(after_id)s::uuid, '00000000-0000-0000-0000-000000000000'::uuid))
      AND j.state = 'done' AND j.updated_at < %(done_before)s::float8
    ORDER BY j.created_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
ended AS (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.state IN ('failed', 'dead', 'cancelled') AND j.updated_at < %(dead_before)s::float8
      AND j.updated_at >= coalesce(%(after_updated)s::float8, '-Infinity'::float8)
    ORDER BY j.updated_at
    LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM done))
    FOR UPDATE SKIP LOCKED
),
doomed AS (
    SELECT id FROM done UNION ALL SELECT id FROM ended
),
gone AS (
    DELETE FROM trio_jobs_jobs j USING doomed d
    WHERE j.id = d.id AND j.state IN ('done', 'failed', 'dead', 'cancelled')
    RETURNING j.id, j.state, j.created_at, j.updated_at
),
steps AS (
    DELETE FROM trio_jobs_steps s USING gone g WHERE s.job_id = g.id
),
leases AS (
    DELETE FROM trio_jobs_leases s USING gone g WHERE s.job_id = g.id
),
stale_rates AS (
    SELECT x.name, x.key FROM trio_jobs_rate_limits x
    WHERE x.expires_at <= trio_jobs_now(%(now)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rates AS (
    DELETE FROM trio_jobs_rate_limits x USING stale_rates s
    WHERE x.name = s.name AND x.key = s.key AND x.expires_at <= trio_jobs_now(%(now)s)
),
last_done AS (
    SELECT g.created_at, g.id FROM gone g WHERE g.state = 'done'
    ORDER BY g.created_at DESC, g.id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM gone), (SELECT created_at FROM last_done),
    (SELECT id FROM last_done), (SELECT max(g.updated_at) FROM gone g WHERE g.state <> 'done');
