-- The transactional outbox (trio_jobs_outbox), for a queue that does not live in
-- the app's database: the app's transaction stages rows, a relay claims,
-- publishes and marks them. `%(now)s` is NULL in production (the database's
-- clock) and a float only under a test clock.

-- name: outbox_stage
-- Up to 1,000 rows in one statement, inside the app's transaction, sent as one
-- JSON array (an event row comes without an id: the database makes one).
-- `notify` are the queues the caller's 250 ms throttle allows: each
-- is announced with a transactional pg_notify on the outbox channel, delivered
-- when the app commits and never when it rolls back.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS t(ord int, id uuid, queue text, request json)
),
ins AS (
    INSERT INTO trio_jobs_outbox (id, request, queue, staged_at)
    SELECT coalesce(i.id, gen_random_uuid()), i.request, i.queue, n.now
    FROM input i CROSS JOIN n
    ORDER BY i.ord
    RETURNING queue
),
notified AS (
    SELECT s.queue, pg_notify(%(channel)s, s.queue)
    FROM (SELECT DISTINCT queue FROM ins WHERE queue = ANY(%(notify)s::text[])) s
)
SELECT (SELECT count(*) FROM ins), (SELECT array_agg(queue) FROM notified);

-- name: outbox_claim
-- A relay's batch, in one statement: the oldest unpublished rows nobody holds
-- (never leased, or their lease lapsed), leased for `lease` seconds. SKIP LOCKED
-- keeps concurrent relays apart; the new lease_until fences their releases.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
pick AS (
    SELECT o.seq FROM trio_jobs_outbox o
    WHERE o.published_at IS NULL
      AND (o.lease_until IS NULL OR o.lease_until <= (SELECT now FROM n))
    ORDER BY o.seq
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE trio_jobs_outbox o SET lease_until = n.now + %(lease)s, attempts = o.attempts + 1
FROM pick p, n
WHERE o.seq = p.seq
RETURNING o.seq, o.id, o.request, o.staged_at, o.attempts, o.lease_until, n.now;

-- name: outbox_mark_published_many
-- A published batch, in one statement.
UPDATE trio_jobs_outbox o SET published_at = n.now, lease_until = NULL
FROM (SELECT trio_jobs_now(%(now)s) AS now) n
WHERE o.id = ANY(%(ids)s::uuid[]) AND o.published_at IS NULL;

-- name: outbox_mark_published
-- One published row (the row loop).
UPDATE trio_jobs_outbox o SET published_at = n.now, lease_until = NULL
FROM (SELECT trio_jobs_now(%(now)s) AS now) n
WHERE o.id = %(id)s AND o.published_at IS NULL;

-- name: outbox_release
-- Hand rows back unpublished, only where this relay's lease still holds. The
-- poison row keeps its counted claim, records what failed and, with `hold`, is
-- kept out of the claims for that long; the rows after it are free at once and
-- their claim is not counted (nothing tried them).
UPDATE trio_jobs_outbox o SET
    lease_until = CASE WHEN o.id = %(poison)s::uuid THEN n.now + %(hold)s::float8 ELSE NULL END,
    attempts = CASE WHEN o.id = %(poison)s::uuid THEN o.attempts ELSE greatest(o.attempts - 1, 0) END,
    last_error = CASE WHEN o.id = %(poison)s::uuid THEN %(error)s::text ELSE o.last_error END
FROM (SELECT trio_jobs_now(%(now)s) AS now) n,
    unnest(%(ids)s::uuid[], %(leases)s::float8[]) AS r(id, lease_until)
WHERE o.id = r.id AND o.lease_until = r.lease_until AND o.published_at IS NULL;

-- name: outbox_purge
-- Up to `limit` rows published more than `older_than` seconds ago, oldest
-- first. An unpublished row is never deleted.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
doomed AS (
    SELECT o.seq FROM trio_jobs_outbox o, n
    WHERE o.published_at IS NOT NULL AND o.published_at <= n.now - %(older_than)s
    ORDER BY o.seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM trio_jobs_outbox o USING doomed d
    WHERE o.seq = d.seq AND o.published_at IS NOT NULL
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: outbox_pending
-- Rows not yet published (tests, metrics).
SELECT count(*) FROM trio_jobs_outbox WHERE published_at IS NULL;
