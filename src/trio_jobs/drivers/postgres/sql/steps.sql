-- Step records, keyed by (job_id, name), and the event bus.

-- name: steps_load
SELECT name, status, seq, executions, output, error, error_code, wake_at, event, since, deadline,
    started_at, ended_at
FROM trio_jobs_steps
WHERE job_id = %(job_id)s
ORDER BY seq;

-- name: steps_put_many
-- The group commit: many slots' records in one statement. A record lands only
-- while its fence holds the job row (checked under a share lock, so a settle
-- racing it either lands first and refuses the record, or waits for it); a
-- replaced record keeps the seq it was first recorded under. Answers the
-- ordinals that landed.
--
-- The records come as one JSON array (`rows`, absent keys read as NULL): the
-- server parses it several times faster than fourteen typed arrays (measured,
-- benchmarks/README.md). Every owned record lands — the upsert's DO UPDATE has
-- no condition, and the combiner never puts two records of one row in a batch —
-- so the answer is the owned ordinals, with no join back to the upsert's rows
-- (the planner, expecting one row from each side, made that join a nested loop:
-- quadratic in the batch).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS t(
        ord int, job_id uuid, worker_id text, claim int8, name text, status text, seq int,
        executions int, output text, error text, error_code text, wake_at float8,
        event text, since float8, deadline float8, started_at float8, ended_at float8)
),
-- The share locks are taken in id order (one lock order: a heartbeat or a
-- settle of the same rows locks them in that order too): each record's row by
-- primary key, the records in id order (why not a join: ack_many, queue.sql).
owned AS MATERIALIZED (
    SELECT i.* FROM (SELECT * FROM input ORDER BY job_id) i
    CROSS JOIN LATERAL (
        SELECT j.state, j.lease_expires_at FROM trio_jobs_jobs j
        WHERE j.id = i.job_id AND j.worker_id = i.worker_id AND j.claim = i.claim
        OFFSET 0
        FOR SHARE OF j
    ) j
    WHERE j.state = 'running' AND j.lease_expires_at > (SELECT now FROM n)
),
put AS (
    INSERT INTO trio_jobs_steps AS s (job_id, name, status, seq, executions, output, error,
        error_code, wake_at, event, since, deadline, started_at, ended_at)
    SELECT o.job_id, o.name, o.status, o.seq, o.executions, o.output::json, o.error,
        o.error_code, o.wake_at, o.event, o.since, o.deadline, o.started_at, o.ended_at
    FROM owned o
    ON CONFLICT (job_id, name) DO UPDATE SET
        status = excluded.status, executions = excluded.executions, output = excluded.output,
        error = excluded.error, error_code = excluded.error_code, wake_at = excluded.wake_at,
        event = excluded.event, since = excluded.since, deadline = excluded.deadline,
        started_at = excluded.started_at, ended_at = excluded.ended_at
)
SELECT o.ord FROM owned o;

-- name: publish
-- Store an event and make every run suspended on it due now; announce their
-- queues in the same statement. The runs are locked in id order, the only rows
-- written (one lock order): two publishes of one event wake the same rows.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
ev AS (
    INSERT INTO trio_jobs_events (name, payload, published_at)
    SELECT %(name)s, %(payload)s::json, n.now FROM n
    RETURNING id
),
locked AS MATERIALIZED (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.state = 'suspended' AND j.waiting_event = %(name)s
      AND j.run_at > (SELECT now FROM n)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
woken AS (
    UPDATE trio_jobs_jobs j SET run_at = n.now
    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.queue
),
notified AS (
    SELECT pg_notify(%(channel)s, s.queue) FROM (SELECT DISTINCT queue FROM woken) s
)
SELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM notified),
    (SELECT array_agg(DISTINCT queue) FROM woken);

-- name: poll
-- Events named `name` published at or after `since`, oldest first, with the
-- bus's own now (the first row always carries it).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now)
SELECT n.now, e.id, e.name, e.payload, e.published_at
FROM n
LEFT JOIN trio_jobs_events e ON e.name = %(name)s AND e.published_at >= %(since)s
ORDER BY e.id;
