-- Rate limits (rate_limiter()): one row per (limiter name, key) holding the
-- acquisitions granted in its last window, oldest first, and the queue of the
-- refused (migration 0010; the same rule as drivers/_window.py's SlidingLog).

-- name: rate_acquire
-- One acquisition of `limit` per `per` seconds, decided in this one statement.
-- The upsert locks the (name, key) row; a concurrent acquirer waits for the
-- lock and then reads the row as the one before it left it (ON CONFLICT DO
-- UPDATE works on the latest committed version), so acquirers in every process
-- take turns and at most `limit` are granted in any interval of length `per`.
-- The instant is the database's clock read after the lock (clock_timestamp), so
-- the log stays in order. Hits that left the window are pruned on the way.
--
-- A grant is decided by the window alone. A refusal records no hit and answers
-- the seconds until its turn: when the hit that must leave the window leaves,
-- if that is within `exact` seconds (a run back a little before its promised
-- slot, or whose slot's last grant came late: it takes the slot as it frees);
-- else its place in the queue. The first refusal after the queue's last
-- promise has passed, or when its next place would come before the hit that
-- must leave leaves (others took its slots), opens a queue on this
-- window (`base`: its last `limit` hits); refusal n of a queue is promised
-- base[n % limit] + per * (1 + n / limit): one per freed slot, round after
-- round, so the refused come back spread instead of all at once. Every answer
-- is at least 1 ms. `expires_at` is when the row holds nothing the limiter
-- needs: its last hit has left the window and its last promise has passed.
INSERT INTO trio_jobs_rate_limits AS r (name, key, hits, granted, at, expires_at)
SELECT %(name)s, %(key)s, ARRAY[n.now], true, n.now, n.now + %(per)s
FROM (SELECT trio_jobs_now(%(now)s) AS now) n
ON CONFLICT (name, key) DO UPDATE SET (hits, granted, at, base, queued, retry_after, expires_at) = (
    SELECT CASE WHEN d.room THEN d.kept || d.now ELSE d.kept END,
           d.room,
           d.now,
           q.base,
           q.queued,
           CASE WHEN d.room THEN 0.0
                WHEN q.queues THEN greatest(0.001, q.promised - d.now)
                ELSE greatest(0.001, d.wait)
           END,
           greatest(CASE WHEN d.room THEN d.now ELSE d.kept[cardinality(d.kept)] END + %(per)s,
                    q.frontier)
    FROM (
        SELECT w.now, w.kept,
               cardinality(w.kept) < %(limit)s::int AS room,
               -- until the hit that must leave leaves (null while there is room)
               w.kept[cardinality(w.kept) - %(limit)s::int + 1] + %(per)s - w.now AS wait,
               -- the queue's last promise, null without a queue or of another limit
               CASE WHEN r.queued > 0 AND cardinality(r.base) = %(limit)s::int
                    THEN r.base[mod(r.queued - 1, %(limit)s::int) + 1]
                         + %(per)s * (1 + (r.queued - 1) / %(limit)s::int)
               END AS frontier,
               -- and the place it would promise next
               CASE WHEN r.queued > 0 AND cardinality(r.base) = %(limit)s::int
                    THEN r.base[mod(r.queued, %(limit)s::int) + 1]
                         + %(per)s * (1 + r.queued / %(limit)s::int)
               END AS next
        FROM (
            SELECT n.now,
                   ARRAY(SELECT h FROM unnest(r.hits) AS h WHERE h > n.now - %(per)s ORDER BY h)
                       AS kept
            FROM (SELECT trio_jobs_now(%(now)s) AS now) n
        ) w
    ) d,
    LATERAL (
        SELECT o.queues, o.base, o.queued,
               CASE WHEN o.queues
                    THEN o.base[mod(o.queued - 1, %(limit)s::int) + 1]
                         + %(per)s * (1 + (o.queued - 1) / %(limit)s::int)
               END AS promised,
               CASE WHEN o.queues
                    THEN o.base[mod(o.queued - 1, %(limit)s::int) + 1]
                         + %(per)s * (1 + (o.queued - 1) / %(limit)s::int)
                    ELSE d.frontier
               END AS frontier
        FROM (
            SELECT s.queues,
                   CASE WHEN NOT s.queues THEN r.base
                        WHEN s.opens
                        THEN d.kept[cardinality(d.kept) - %(limit)s::int + 1:cardinality(d.kept)]
                        ELSE r.base
                   END AS base,
                   CASE WHEN NOT s.queues THEN r.queued
                        WHEN s.opens THEN 1
                        ELSE r.queued + 1
                   END AS queued
            FROM (
                SELECT NOT d.room AND d.wait > %(exact)s AS queues,
                       -- no queue ahead, or one the window has outrun (others
                       -- took its slots: its next place would come before a
                       -- grant can leave)
                       d.frontier IS NULL OR d.frontier <= d.now
                           OR d.next < d.now + d.wait AS opens
            ) s
        ) o
    ) q
)
RETURNING r.granted, r.retry_after;
