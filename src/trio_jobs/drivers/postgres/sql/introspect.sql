-- The operator surface: show, list, requeue, cancel, remove, promote, pauses,
-- workers, counters. Not a hot path: clarity over statement count, but every
-- call is still one statement or one transaction.
--
-- One lock order (as in queue.sql): a single-row action locks its row first
-- (show_for_update); a bulk one locks its rows in id order, in a `locked` CTE
-- its write joins, or takes them SKIP LOCKED (remove_many), which never waits.

-- name: show
SELECT id, run_id, name, queue, state, attempts, max_attempts, tenant_id, idempotency_key,
    concurrency_key, run_at, created_at, error_code, last_error, progress, result, payload,
    priority, updated_at, worker_id, sensitive,
    trio_jobs_attempt_view(attempt_log, attempts, attempt_worker, attempt_at, attempt_step,
        attempt_step_at, state, updated_at), parent_id::text,
    -- the runs its step.invoke/step.gather enqueued, oldest first (0018)
    ARRAY(SELECT c.id::text FROM trio_jobs_jobs c WHERE c.parent_id = j.id
          ORDER BY c.seq)
FROM trio_jobs_jobs j WHERE id = %(id)s;

-- name: attempt_log
SELECT trio_jobs_attempt_view(attempt_log, attempts, attempt_worker, attempt_at, attempt_step,
        attempt_step_at, state, updated_at)
FROM trio_jobs_jobs WHERE id = %(id)s;

-- name: show_for_update
SELECT id, run_id, name, queue, state, attempts, max_attempts, tenant_id, idempotency_key,
    concurrency_key, run_at, created_at, error_code, last_error, progress, result, payload,
    priority, updated_at, worker_id, sensitive
FROM trio_jobs_jobs WHERE id = %(id)s FOR UPDATE;

-- name: show_steps
SELECT name, status, executions, output, error, started_at, ended_at FROM trio_jobs_steps
WHERE job_id = %(id)s ORDER BY seq;

-- name: resolve_prefix
-- The ids that start with a prefix, read through the primary key: the prefix
-- padded with 0s and with fs bounds them (a uuid sorts as its hex text).
SELECT id FROM trio_jobs_jobs
WHERE id BETWEEN %(low)s::uuid AND %(high)s::uuid
ORDER BY id
LIMIT %(limit)s;

-- name: list_older
-- A page newest first, strictly older than the mark (no mark: from the newest).
SELECT id, run_id, name, queue, state, attempts, max_attempts, tenant_id, idempotency_key,
    concurrency_key, run_at, created_at, error_code, last_error, progress, result, payload,
    priority, updated_at, worker_id, sensitive
FROM trio_jobs_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(id_prefix)s::text IS NULL OR left(id::text, length(%(id_prefix)s)) = %(id_prefix)s)
  AND (%(created_from)s::float8 IS NULL OR created_at >= %(created_from)s)
  AND (%(created_to)s::float8 IS NULL OR created_at < %(created_to)s)
  AND (%(mark_at)s::float8 IS NULL OR (created_at, id) < (%(mark_at)s, %(mark_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: list_newer
-- The rows strictly newer than the mark, nearest first (the caller reverses).
SELECT id, run_id, name, queue, state, attempts, max_attempts, tenant_id, idempotency_key,
    concurrency_key, run_at, created_at, error_code, last_error, progress, result, payload,
    priority, updated_at, worker_id, sensitive
FROM trio_jobs_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(id_prefix)s::text IS NULL OR left(id::text, length(%(id_prefix)s)) = %(id_prefix)s)
  AND (%(created_from)s::float8 IS NULL OR created_at >= %(created_from)s)
  AND (%(created_to)s::float8 IS NULL OR created_at < %(created_to)s)
  AND (created_at, id) > (%(mark_at)s, %(mark_id)s::uuid)
ORDER BY created_at ASC, id ASC
LIMIT %(limit)s;

-- name: live_holder
-- The live row holding a job's (name, tenant, key), if any.
SELECT id FROM trio_jobs_jobs
WHERE name = %(name)s AND idempotency_key = %(key)s
  AND tenant_id IS NOT DISTINCT FROM %(tenant_id)s
  AND state IN ('ready', 'delayed', 'running', 'suspended');

-- name: steps_cut
-- Drop a step and every later one (requeue from a step).
DELETE FROM trio_jobs_steps s
USING trio_jobs_steps cut
WHERE cut.job_id = %(id)s AND cut.name = %(step)s
  AND s.job_id = %(id)s AND s.seq >= cut.seq
RETURNING s.name;

-- name: step_get
SELECT status, seq FROM trio_jobs_steps WHERE job_id = %(id)s AND name = %(step)s FOR UPDATE;

-- name: step_resolve_ran
UPDATE trio_jobs_steps SET status = 'completed', output = %(output)s::json, error = NULL,
    error_code = NULL
WHERE job_id = %(id)s AND name = %(step)s;

-- name: step_resolve_not_ran
DELETE FROM trio_jobs_steps WHERE job_id = %(id)s AND name = %(step)s;

-- name: requeue_row
UPDATE trio_jobs_jobs SET state = 'ready', attempts = 0, run_at = n.now, error_code = NULL,
    last_error = NULL, result = NULL, updated_at = n.now,
    -- a done row's open entry is pushed, closed as done, for good
    attempt_log = trio_jobs_attempt_view(attempt_log, attempts, attempt_worker, attempt_at, attempt_step,
        attempt_step_at, state, updated_at),
    attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
FROM (SELECT trio_jobs_now(%(now)s) AS now) n
WHERE id = %(id)s
RETURNING queue;

-- name: cancel_row
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
hit AS (
    UPDATE trio_jobs_jobs j SET state = 'cancelled', worker_id = NULL, claim = NULL,
        error_code = 'X_ABORTED', last_error = %(last_error)s, updated_at = n.now,
        -- a running attempt ends here (its worker's settle will find the fence gone)
        attempt_log = CASE WHEN j.state = 'running' THEN trio_jobs_attempt_push(j.attempt_log,
            j.attempts, j.attempt_worker, j.attempt_at, j.attempt_step, j.attempt_step_at,
            n.now, 'cancelled', 'X_ABORTED', %(line)s) ELSE j.attempt_log END,
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM n
    WHERE j.id = %(id)s AND j.state IN ('ready', 'delayed', 'running', 'suspended')
    RETURNING j.id
),
freed AS (
    DELETE FROM trio_jobs_leases s USING hit WHERE s.job_id = hit.id
)
SELECT count(*) FROM hit;

-- name: remove_row
WITH gone AS (
    DELETE FROM trio_jobs_jobs WHERE id = %(id)s AND state <> 'running' RETURNING id
),
steps AS (
    DELETE FROM trio_jobs_steps s USING gone WHERE s.job_id = gone.id
),
freed AS (
    DELETE FROM trio_jobs_leases s USING gone WHERE s.job_id = gone.id
)
SELECT count(*) FROM gone;

-- name: remove_many
-- SKIP LOCKED: never waits for a row, so needs no lock order.
WITH matched AS (
    SELECT id FROM trio_jobs_jobs
    WHERE state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(name)s::text IS NULL OR name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
    ORDER BY created_at, id
    LIMIT %(bound)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM trio_jobs_jobs j USING matched m WHERE j.id = m.id RETURNING j.id
),
steps AS (
    DELETE FROM trio_jobs_steps s USING gone WHERE s.job_id = gone.id
),
freed AS (
    DELETE FROM trio_jobs_leases s USING gone WHERE s.job_id = gone.id
)
SELECT count(*) FROM gone;

-- name: count_matching
SELECT count(*) FROM trio_jobs_jobs
WHERE state = %(state)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s);

-- name: requeue_many
-- Terminal rows whose key no live row holds, the oldest per key, the oldest
-- first, up to the bound; then how many such rows are left.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
movable AS (
    SELECT DISTINCT ON (j.name, j.tenant_id, j.idempotency_key) j.id, j.created_at
    FROM trio_jobs_jobs j
    WHERE j.state = %(state)s
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
      AND (%(name)s::text IS NULL OR j.name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s)
      AND NOT EXISTS (
          SELECT 1 FROM trio_jobs_jobs h
          WHERE h.name = j.name AND h.idempotency_key = j.idempotency_key
            AND h.tenant_id IS NOT DISTINCT FROM j.tenant_id
            AND h.state IN ('ready', 'delayed', 'running', 'suspended'))
    ORDER BY j.name, j.tenant_id, j.idempotency_key, j.created_at, j.id
),
chosen AS (
    SELECT id FROM movable ORDER BY created_at, id LIMIT %(bound)s
),
-- Locked in id order, the only rows written; a row that left the state since
-- the statement began (requeued, removed by another call) is left alone.
locked AS MATERIALIZED (
    SELECT j.id FROM trio_jobs_jobs j JOIN chosen c ON c.id = j.id
    WHERE j.state = %(state)s
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
moved AS (
    UPDATE trio_jobs_jobs j SET state = 'ready', attempts = 0, run_at = n.now,
        error_code = NULL, last_error = NULL, result = NULL, updated_at = n.now,
        attempt_log = trio_jobs_attempt_view(j.attempt_log, j.attempts, j.attempt_worker,
            j.attempt_at, j.attempt_step, j.attempt_step_at, j.state, j.updated_at),
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.id, j.queue
)
SELECT count(*), array_agg(DISTINCT queue) FROM moved;

-- name: requeue_many_remaining
SELECT count(*) FROM trio_jobs_jobs j
WHERE j.state = %(state)s
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s)
  AND NOT EXISTS (
      SELECT 1 FROM trio_jobs_jobs h
      WHERE h.name = j.name AND h.idempotency_key = j.idempotency_key
        AND h.tenant_id IS NOT DISTINCT FROM j.tenant_id
        AND h.state IN ('ready', 'delayed', 'running', 'suspended'));

-- name: promote_row
-- Promotable: delayed, or ready and backing off (run_at in the future).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now)
UPDATE trio_jobs_jobs j SET run_at = n.now, state = 'ready', promoted = true, updated_at = n.now
FROM n
WHERE j.id = %(id)s
  AND (j.state = 'delayed' OR (j.state = 'ready' AND j.run_at > n.now))
RETURNING j.queue;

-- name: promote_many
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
matched AS (
    SELECT j.id FROM trio_jobs_jobs j, n
    WHERE j.state = %(state)s
      AND (j.state = 'delayed' OR (j.state = 'ready' AND j.run_at > n.now))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
      AND (%(name)s::text IS NULL OR j.name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s)
),
chosen AS (
    SELECT j.id FROM trio_jobs_jobs j JOIN matched m ON m.id = j.id
    ORDER BY j.created_at, j.id LIMIT %(bound)s
),
-- Locked in id order, the only rows written; a row no longer promotable (claimed,
-- promoted by another call) is left alone.
locked AS MATERIALIZED (
    SELECT j.id FROM trio_jobs_jobs j JOIN chosen c ON c.id = j.id
    WHERE j.state = %(state)s
      AND (j.state = 'delayed' OR (j.state = 'ready' AND j.run_at > (SELECT now FROM n)))
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
moved AS (
    UPDATE trio_jobs_jobs j SET run_at = n.now, state = 'ready', promoted = true,
        updated_at = n.now
    FROM locked l, n WHERE j.id = l.id
    RETURNING j.queue
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM matched),
    (SELECT array_agg(DISTINCT queue) FROM moved);

-- name: preview_remove
-- A dry run of remove_many until nothing remains: how many rows, and the first
-- ids it would take (oldest first). Writes and locks nothing.
WITH matched AS (
    SELECT id, created_at FROM trio_jobs_jobs
    WHERE state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(name)s::text IS NULL OR name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
)
SELECT (SELECT count(*) FROM matched),
    ARRAY(SELECT id FROM matched ORDER BY created_at, id LIMIT %(sample)s);

-- name: preview_requeue
-- A dry run of requeue_many until nothing remains: per key no live row holds,
-- its oldest row (requeue_many's `movable`; the others then find the key held).
WITH movable AS (
    SELECT DISTINCT ON (j.name, j.tenant_id, j.idempotency_key) j.id, j.created_at
    FROM trio_jobs_jobs j
    WHERE j.state = %(state)s
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
      AND (%(name)s::text IS NULL OR j.name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s)
      AND NOT EXISTS (
          SELECT 1 FROM trio_jobs_jobs h
          WHERE h.name = j.name AND h.idempotency_key = j.idempotency_key
            AND h.tenant_id IS NOT DISTINCT FROM j.tenant_id
            AND h.state IN ('ready', 'delayed', 'running', 'suspended'))
    ORDER BY j.name, j.tenant_id, j.idempotency_key, j.created_at, j.id
)
SELECT (SELECT count(*) FROM movable),
    ARRAY(SELECT id FROM movable ORDER BY created_at, id LIMIT %(sample)s);

-- name: preview_promote
-- A dry run of promote_many until nothing remains (promote_many's `matched`).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
matched AS (
    SELECT j.id, j.created_at FROM trio_jobs_jobs j, n
    WHERE j.state = %(state)s
      AND (j.state = 'delayed' OR (j.state = 'ready' AND j.run_at > n.now))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
      AND (%(name)s::text IS NULL OR j.name = %(name)s)
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s)
)
SELECT (SELECT count(*) FROM matched),
    ARRAY(SELECT id FROM matched ORDER BY created_at, id LIMIT %(sample)s);

-- name: preview_rows
SELECT id, run_id, name, queue, state, attempts, max_attempts, tenant_id, idempotency_key,
    concurrency_key, run_at, created_at, error_code, last_error, progress, result, payload,
    priority, updated_at, worker_id, sensitive
FROM trio_jobs_jobs
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY created_at, id;

-- name: pause_queue
INSERT INTO trio_jobs_queue_pauses (queue, paused_at) VALUES (%(queue)s, trio_jobs_now(%(now)s))
ON CONFLICT (queue) DO NOTHING;

-- name: resume_queue
WITH gone AS (DELETE FROM trio_jobs_queue_pauses WHERE queue = %(queue)s RETURNING queue)
SELECT pg_notify(%(channel)s, %(queue)s);

-- name: paused_queues
SELECT queue FROM trio_jobs_queue_pauses ORDER BY queue;

-- name: record_worker
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now)
INSERT INTO trio_jobs_workers (id, host, pid, started_at, queues, slots, in_flight,
    last_heartbeat, expires_at)
SELECT %(id)s, %(host)s, %(pid)s, %(started_at)s, %(queues)s, %(slots)s::json, %(in_flight)s,
    n.now, n.now + %(ttl)s
FROM n
ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
    started_at = excluded.started_at, queues = excluded.queues, slots = excluded.slots,
    in_flight = excluded.in_flight, last_heartbeat = excluded.last_heartbeat,
    expires_at = excluded.expires_at;

-- name: remove_worker
DELETE FROM trio_jobs_workers WHERE id = %(id)s;

-- name: workers
-- The live workers, oldest first; an expired row leaves in the same statement.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
expired AS (
    DELETE FROM trio_jobs_workers w USING n WHERE w.expires_at <= n.now
)
SELECT w.id, w.host, w.pid, w.started_at, w.queues, w.slots, w.in_flight, w.last_heartbeat
FROM trio_jobs_workers w, n
WHERE w.expires_at > n.now
ORDER BY w.started_at;

-- name: counters
-- Minute buckets read back in the spec's tiers: 1-minute for 24 h, 5-minute for
-- 7 days, 1-hour for 30 days; older rows are deleted in the same statement.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
expired AS (
    DELETE FROM trio_jobs_counters c USING n WHERE n.now - c.bucket > 30 * 86400
),
aged AS (
    SELECT c.*, n.now - c.bucket AS age FROM trio_jobs_counters c, n
    WHERE n.now - c.bucket <= 30 * 86400
      AND c.bucket >= %(since)s
      AND (%(name)s::text IS NULL OR c.name = %(name)s)
)
SELECT
    CASE WHEN age <= 86400 THEN floor(bucket / 60) * 60
         WHEN age <= 7 * 86400 THEN floor(bucket / 300) * 300
         ELSE floor(bucket / 3600) * 3600 END AS tier_bucket,
    name, sum(done), sum(retried), sum(failed), sum(dead), sum(duration), max(queue)
FROM aged
GROUP BY 1, 2
ORDER BY 1, 2;
