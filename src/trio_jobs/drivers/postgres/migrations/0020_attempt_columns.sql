-- 0020: the open attempt lives in plain columns; the jsonb attempt log holds
-- only the attempts that ended otherwise than done.
--
-- Before, every claim rebuilt the jsonb log (a new entry, the oldest past 20
-- dropped) and every heartbeat rewrote its last entry: ~10% of the server's CPU
-- for a no-op job. Now the claim writes four scalars (when, by whom, and the
-- step a heartbeat reported), the ack leaves them, and only a settle that ends
-- the attempt otherwise (a nack, a lapse, an orphan's hand-back, a cancel) or a
-- requeue of a done row pushes the entry onto the jsonb log, where it stays.
-- A reader sees the log with the open entry after it (closed as done, at the
-- row's settle time, when the row is done): trio_jobs_attempt_view.
--
-- attempt_at NULL: no open entry (never claimed since this migration, or its
-- entry was pushed). The entry's attempt number is the row's `attempts`, which
-- nothing changes while an entry is open without pushing it first.
ALTER TABLE trio_jobs_jobs
    ADD COLUMN attempt_at float8,
    ADD COLUMN attempt_worker text,
    ADD COLUMN attempt_step text,
    ADD COLUMN attempt_step_at float8;

-- Push an entry onto a log (at NULL: nothing to push, the log as it was),
-- keeping the newest 20. `ended` NULL pushes it open (a reader's view of a
-- running attempt).
CREATE FUNCTION trio_jobs_attempt_push(log jsonb, attempt integer, worker text, at float8,
    step text, step_at float8, ended float8, outcome text, code text, message text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN at IS NULL THEN log
        ELSE (CASE WHEN jsonb_array_length(coalesce(log, '[]'::jsonb)) >= 20 THEN log - 0
                   ELSE coalesce(log, '[]'::jsonb) END)
            || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                'attempt', attempt, 'worker_id', worker, 'started_at', at,
                'step', step, 'step_started_at', step_at, 'ended_at', ended,
                'outcome', outcome, 'error_code', code, 'error', message)))
    END
$$;

-- The log as readers see it: the pushed entries, then the open one (ended as
-- done at the row's settle time when the row is done).
CREATE FUNCTION trio_jobs_attempt_view(log jsonb, attempt integer, worker text, at float8,
    step text, step_at float8, state text, settled_at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT trio_jobs_attempt_push(log, attempt, worker, at, step, step_at,
        CASE WHEN state = 'done' THEN settled_at END,
        CASE WHEN state = 'done' THEN 'done' END, NULL, NULL)
$$;

-- A stored log's open last entry moves to the columns: the entry of a running
-- row, or the entry an ack left open (0011) on a done row.
UPDATE trio_jobs_jobs SET
    attempt_at = (attempt_log -> -1 ->> 'started_at')::float8,
    attempt_worker = attempt_log -> -1 ->> 'worker_id',
    attempt_step = attempt_log -> -1 ->> 'step',
    attempt_step_at = (attempt_log -> -1 ->> 'step_started_at')::float8,
    attempt_log = CASE WHEN jsonb_array_length(attempt_log) = 1 THEN NULL
                       ELSE attempt_log - (-1) END
WHERE jsonb_typeof(attempt_log) = 'array' AND jsonb_array_length(attempt_log) > 0
  AND NOT (attempt_log -> -1) ? 'ended_at';

DROP FUNCTION trio_jobs_attempt_begin(jsonb, integer, text, float8);
DROP FUNCTION trio_jobs_attempt_end(jsonb, float8, text, text, text);
DROP FUNCTION trio_jobs_attempt_step(jsonb, text, float8);
DROP FUNCTION trio_jobs_attempt_read(jsonb, text, float8);
