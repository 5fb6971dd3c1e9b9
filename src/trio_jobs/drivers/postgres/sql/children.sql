-- Child jobs (step.invoke / step.gather; migration 0018 holds the counting and
-- the wake). Every statement here is its own, beside the queue's.

-- name: children
-- A parent's children as step.invoke/step.gather read them: state, result,
-- error code; an id no row holds is absent (the caller reads it as cancelled).
SELECT id::text, state, result, error_code FROM trio_jobs_jobs WHERE id = ANY(%(ids)s::uuid[]);

-- name: children_adopt
-- In the transaction that enqueued a step's children and records its step: the
-- step's wait counts the children that inserted. The parent's row is taken
-- (FOR SHARE, as the step record's fence takes it) before the wait row, so the
-- wait row follows the job rows in the one lock order. The fence is the step
-- record's, in the same transaction: a parent that lost its claim has its
-- record refused, and the whole transaction goes.
WITH parent AS (
    SELECT j.id, j.queue FROM trio_jobs_jobs j
    WHERE j.id = %(parent_id)s
    FOR SHARE OF j
)
INSERT INTO trio_jobs_child_waits AS w (id, parent_id, pending, channel, queue)
SELECT %(wait)s::uuid, p.id, %(count)s::int, %(channel)s, p.queue FROM parent p
ON CONFLICT (id) DO UPDATE SET pending = w.pending + excluded.pending
RETURNING w.pending;

-- name: children_wait
-- The parent has handed itself back suspended on its wait: mark the wait
-- `waiting`, so its last child's settle makes the parent due; a wait already
-- gone (every child settled since the parent read them) makes it due now, and
-- announces its queue. Either the wait row is taken or the job row, never both.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
w AS (
    UPDATE trio_jobs_child_waits SET waiting = true
    WHERE id = %(wait)s AND pending > 0
    RETURNING id
),
due AS (
    UPDATE trio_jobs_jobs j SET run_at = n.now
    FROM n
    WHERE j.id = %(id)s AND j.state = 'suspended' AND j.run_at > n.now
      AND NOT EXISTS (SELECT 1 FROM w)
    RETURNING j.queue
),
notified AS (
    SELECT pg_notify(%(channel)s, due.queue) FROM due
)
SELECT (SELECT queue FROM due), (SELECT count(*) FROM notified);

-- name: lock_family
-- Before a cancel: the job and its live descendants (a cancelled parent cancels
-- its live children, and theirs), locked in id order (one lock order), read
-- unlocked first (parent_id never changes).
WITH RECURSIVE family AS (
    SELECT %(id)s::uuid AS id
    UNION
    SELECT c.id FROM trio_jobs_jobs c JOIN family f ON c.parent_id = f.id
)
SELECT j.id::text FROM trio_jobs_jobs j
WHERE j.id IN (SELECT id FROM family)
  AND (j.id = %(id)s OR j.state IN ('ready', 'delayed', 'running', 'suspended'))
ORDER BY j.id
FOR NO KEY UPDATE OF j;

-- name: cancel_descendants
-- The cancel's cascade, after lock_family locked them: every live descendant
-- of the job, in one statement (their waits are counted down together, in id
-- order, at its end), their concurrency leases released.
WITH RECURSIVE n AS (SELECT trio_jobs_now(%(now)s) AS now),
family AS (
    SELECT c.id FROM trio_jobs_jobs c WHERE c.parent_id = %(id)s
    UNION
    SELECT c.id FROM trio_jobs_jobs c JOIN family f ON c.parent_id = f.id
),
locked AS MATERIALIZED (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.id IN (SELECT id FROM family)
      AND j.state IN ('ready', 'delayed', 'running', 'suspended')
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
hit AS (
    UPDATE trio_jobs_jobs j SET state = 'cancelled', worker_id = NULL, claim = NULL,
        error_code = 'X_ABORTED', last_error = %(last_error)s, updated_at = n.now,
        -- a running attempt ends here (its worker's settle will find the fence gone)
        attempt_log = CASE WHEN j.state = 'running' THEN trio_jobs_attempt_push(j.attempt_log,
            j.attempts, j.attempt_worker, j.attempt_at, j.attempt_step, j.attempt_step_at,
            n.now, 'cancelled', 'X_ABORTED', %(line)s) ELSE j.attempt_log END,
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.id
),
freed AS (
    DELETE FROM trio_jobs_leases s USING hit WHERE s.job_id = hit.id
)
SELECT count(*) FROM hit;
