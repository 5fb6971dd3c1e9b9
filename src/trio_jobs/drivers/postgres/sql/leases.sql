-- Fleet-wide concurrency: one row per held slot, keyed (lease_key, slot). The
-- primary key is what serialises two workers reaching for the same slot.

-- name: lease_acquire
-- Answers the slot this fence already holds, else the first free (absent or
-- expired) slot below `limit` taken now, else nothing. `free` names the slot
-- tried: a free slot with no `taken` lost a race and is worth asking again.
-- `holders`/`own`: how many live holders block, and whether all are this job.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
-- Fenced like every write: only the claim that holds the row's lease takes a slot.
owner AS (
    SELECT 1 FROM trio_jobs_jobs j, n
    WHERE j.id = %(job_id)s AND j.state = 'running' AND j.worker_id = %(worker_id)s
      AND j.claim = %(claim)s AND j.lease_expires_at > n.now
),
cur AS (
    SELECT s.slot, s.job_id, s.worker_id, s.claim, s.expires_at > n.now AS live
    FROM trio_jobs_leases s, n
    WHERE s.lease_key = %(key)s AND s.slot < %(limit)s
),
mine AS (
    SELECT min(slot) AS slot FROM cur
    WHERE live AND job_id = %(job_id)s AND worker_id = %(worker_id)s AND claim = %(claim)s
      AND EXISTS (SELECT 1 FROM owner)
),
free AS (
    SELECT g.slot FROM generate_series(0, %(limit)s - 1) AS g(slot)
    WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.slot = g.slot AND cur.live)
    ORDER BY g.slot LIMIT 1
),
taken AS (
    INSERT INTO trio_jobs_leases AS s (lease_key, slot, job_id, worker_id, claim, expires_at)
    SELECT %(key)s, free.slot, %(job_id)s, %(worker_id)s, %(claim)s, n.now + %(ttl)s
    FROM free, n
    WHERE (SELECT slot FROM mine) IS NULL AND EXISTS (SELECT 1 FROM owner)
    ON CONFLICT (lease_key, slot) DO UPDATE SET
        job_id = excluded.job_id, worker_id = excluded.worker_id, claim = excluded.claim,
        expires_at = excluded.expires_at
        WHERE s.expires_at <= (SELECT now FROM n)
    RETURNING s.slot
)
SELECT (SELECT slot FROM mine), (SELECT slot FROM taken),
    CASE WHEN EXISTS (SELECT 1 FROM owner) THEN (SELECT slot FROM free) END,
    (SELECT count(*) FROM cur WHERE live),
    (SELECT coalesce(bool_and(job_id = %(job_id)s), false) FROM cur WHERE live);

-- name: lease_release
DELETE FROM trio_jobs_leases WHERE job_id = %(job_id)s;

-- name: lease_held
SELECT count(*) FROM trio_jobs_leases
WHERE lease_key = %(key)s AND expires_at > trio_jobs_now(%(now)s);
