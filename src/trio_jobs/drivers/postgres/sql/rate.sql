-- Rate limits (rate_limiter()): one row per (limiter name, key) holding the
-- acquisitions granted in its last window, oldest first.

-- name: rate_acquire
-- One acquisition of `limit` per `per` seconds, decided in this one statement.
-- The upsert locks the (name, key) row; a concurrent acquirer waits for the
-- lock and then reads the row as the one before it left it (ON CONFLICT DO
-- UPDATE works on the latest committed version), so acquirers in every process
-- take turns and at most `limit` are granted in any interval of length `per`.
-- The instant is the database's clock read after the lock (clock_timestamp), so
-- the log stays in order. Hits that left the window are pruned on the way; a
-- refusal records nothing else. Answers whether it was granted and, if not,
-- the seconds until the hit that must leave the window leaves it (at least
-- 1 ms, as every driver answers).
INSERT INTO trio_jobs_rate_limits AS r (name, key, hits, granted, at)
SELECT %(name)s, %(key)s, ARRAY[n.now], true, n.now
FROM (SELECT trio_jobs_now(%(now)s) AS now) n
ON CONFLICT (name, key) DO UPDATE SET (hits, granted, at) = (
    SELECT CASE WHEN cardinality(w.kept) < %(limit)s THEN w.kept || w.now ELSE w.kept END,
           cardinality(w.kept) < %(limit)s,
           w.now
    FROM (
        SELECT n.now,
               ARRAY(SELECT h FROM unnest(r.hits) AS h WHERE h > n.now - %(per)s ORDER BY h)
                   AS kept
        FROM (SELECT trio_jobs_now(%(now)s) AS now) n
    ) w
)
RETURNING r.granted,
    CASE WHEN r.granted THEN 0.0
         ELSE greatest(0.001, r.hits[cardinality(r.hits) - %(limit)s + 1] + %(per)s - r.at)
    END;
