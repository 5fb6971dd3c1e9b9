-- Scheduled tasks: the leaders' leases, the fires, the pauses (0006).

-- name: task_lead
-- Register each task and take its lease for `leader` when nobody holds it, its
-- holder's lease lapsed, or `leader` holds it already (a renewal); a task seen
-- for the first time is armed at now (its watermark). Rows are upserted in name
-- order, so two schedulers upserting overlapping sets lock them in one order.
-- A row another holds is locked by the conflict but left as it is. Answers
-- every task's state after the statement, with its pause.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
spec AS (
    SELECT s.name, s.schedule, s.tz, s.catch_up, s.queue
    FROM unnest(%(names)s::text[], %(schedules)s::text[], %(tzs)s::text[],
        %(catch_ups)s::text[], %(queues)s::text[]) AS s(name, schedule, tz, catch_up, queue)
),
up AS (
    INSERT INTO trio_jobs_tasks AS t (name, schedule, tz, catch_up, queue, watermark, armed_at,
        leader, lease_expires_at, updated_at)
    SELECT s.name, s.schedule, s.tz, s.catch_up, s.queue, n.now, n.now, %(leader)s,
        n.now + %(ttl)s::float8, n.now
    FROM spec s CROSS JOIN n
    ORDER BY s.name
    ON CONFLICT (name) DO UPDATE SET schedule = excluded.schedule, tz = excluded.tz,
        catch_up = excluded.catch_up, queue = excluded.queue, leader = excluded.leader,
        lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at
    WHERE t.leader IS NULL OR t.leader = excluded.leader
        OR t.lease_expires_at IS NULL OR t.lease_expires_at <= excluded.updated_at
    RETURNING t.name, t.leader, t.lease_expires_at, t.watermark, t.last_fire
),
state AS (
    SELECT u.name, u.leader, u.lease_expires_at, u.watermark, u.last_fire FROM up u
    UNION ALL
    SELECT t.name, t.leader, t.lease_expires_at, t.watermark, t.last_fire
    FROM trio_jobs_tasks t
    WHERE t.name = ANY(%(names)s::text[]) AND t.name NOT IN (SELECT name FROM up)
)
SELECT s.name, s.leader, s.lease_expires_at, s.watermark, s.last_fire,
    EXISTS (SELECT 1 FROM trio_jobs_task_pauses p WHERE p.task = s.name)
FROM state s;

-- name: task_fire
-- The fires (`fires`, a JSON array): each moves its task's watermark only while
-- `leader` holds the lease, the stored watermark is the one the leader read and
-- the task is not paused; the occurrences' rows (`rows`) of the fires that
-- moved are inserted in the same statement (deduped on the live key, as
-- enqueue_many), so a fire lands whole or not at all. The task rows are locked
-- in name order first (as task_lead upserts them). Answers the tasks moved,
-- and the queues with rows due now (announced with a transactional pg_notify).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
f AS (
    SELECT * FROM json_to_recordset(%(fires)s::json)
        AS f(name text, watermark float8, through float8, last_fire float8)
),
locked AS MATERIALIZED (
    SELECT t.name FROM trio_jobs_tasks t
    WHERE t.name IN (SELECT name FROM f)
    ORDER BY t.name
    FOR NO KEY UPDATE OF t
),
moved AS (
    UPDATE trio_jobs_tasks t
    SET watermark = f.through,
        last_fire = coalesce(f.last_fire, t.last_fire),
        fired_at = CASE WHEN f.last_fire IS NULL THEN t.fired_at ELSE n.now END,
        updated_at = n.now
    FROM f CROSS JOIN n
    WHERE t.name = f.name AND t.name IN (SELECT name FROM locked) AND t.leader = %(leader)s AND t.lease_expires_at > n.now
        AND t.watermark = f.watermark
        AND NOT EXISTS (SELECT 1 FROM trio_jobs_task_pauses p WHERE p.task = t.name)
    RETURNING t.name
),
input AS (
    SELECT r.* FROM json_to_recordset(%(rows)s::json) AS r(
        ord int, task text, id uuid, run_id uuid, name text, queue text, payload json,
        idempotency_key text, concurrency_key text, max_attempts int)
    WHERE r.task IN (SELECT name FROM moved)
),
ins AS (
    INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key,
        concurrency_key, max_attempts, state, run_at, created_at, updated_at, sensitive)
    SELECT i.id, i.run_id, i.name, i.queue, i.payload, i.idempotency_key, i.concurrency_key,
        i.max_attempts, 'ready', n.now, n.now, n.now, false
    FROM input i CROSS JOIN n
    ORDER BY i.ord
    ON CONFLICT DO NOTHING
    RETURNING queue
),
woke AS (SELECT DISTINCT queue FROM ins),
notified AS (SELECT pg_notify(%(channel)s, w.queue) FROM woke w)
SELECT 'task' AS kind, m.name FROM moved m
UNION ALL
SELECT 'queue', w.queue FROM woke w
UNION ALL
SELECT 'notified', count(*)::text FROM notified;

-- name: task_release
-- A scheduler stopping gives up its leases: another takes over at its next renewal.
UPDATE trio_jobs_tasks SET leader = NULL, lease_expires_at = NULL
WHERE name = ANY(%(names)s::text[]) AND leader = %(leader)s;

-- name: task_pause
INSERT INTO trio_jobs_task_pauses (task, paused_at) VALUES (%(name)s, trio_jobs_now(%(now)s))
ON CONFLICT (task) DO NOTHING;

-- name: task_resume
DELETE FROM trio_jobs_task_pauses WHERE task = %(name)s;

-- name: task_rows
SELECT t.name, t.schedule, t.tz, t.catch_up, t.queue,
    EXISTS (SELECT 1 FROM trio_jobs_task_pauses p WHERE p.task = t.name),
    t.watermark, t.armed_at, t.last_fire, t.fired_at, t.leader, t.lease_expires_at
FROM trio_jobs_tasks t
ORDER BY t.name;

-- name: task_paused
SELECT task FROM trio_jobs_task_pauses ORDER BY task;
