-- 0005: what the dashboard's job page and overview read, written by the
-- statements that already run (no extra round trip on the hot path).
--
-- Each job row keeps its attempt log: a JSON array of its newest 20 claims,
-- oldest first. The claim opens an entry ({attempt, worker_id, started_at});
-- the settle, the reap of a lapsed lease, a hand-back of an orphan or an
-- operator's cancel closes it (ended_at, outcome, error_code and the first
-- line of the error); a heartbeat writes the step in progress (step,
-- step_started_at). NULL: a row no claim has taken since this migration.
ALTER TABLE trio_jobs_jobs ADD COLUMN attempt_log jsonb;

-- A step record says when it started and ended (the worker's reading of the
-- driver's clock); NULL for records written before this migration.
ALTER TABLE trio_jobs_steps ADD COLUMN started_at float8;
ALTER TABLE trio_jobs_steps ADD COLUMN ended_at float8;

-- A counter row says which queue its job settled in, so a reader holding no
-- job handle (`trio-jobs dashboard`) places it; NULL for rows written before.
ALTER TABLE trio_jobs_counters ADD COLUMN queue text;

-- Open an entry for a new claim, dropping the oldest past 20.
CREATE FUNCTION trio_jobs_attempt_begin(log jsonb, attempt integer, worker text, at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT (CASE WHEN jsonb_array_length(coalesce(log, '[]'::jsonb)) >= 20 THEN log - 0
                 ELSE coalesce(log, '[]'::jsonb) END)
        || jsonb_build_array(jsonb_build_object(
            'attempt', attempt, 'worker_id', worker, 'started_at', at))
$$;

-- Close the open entry (none open: the log as it was).
CREATE FUNCTION trio_jobs_attempt_end(log jsonb, at float8, outcome text, code text, message text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN log IS NULL OR jsonb_array_length(log) = 0 OR (log -> -1) ? 'ended_at'
                THEN log
                ELSE jsonb_set(log, '{-1}', (log -> -1) || jsonb_strip_nulls(jsonb_build_object(
                    'ended_at', at, 'outcome', outcome, 'error_code', code, 'error', message)))
           END
$$;

-- The step the open entry's run is in now (NULL: between steps).
CREATE FUNCTION trio_jobs_attempt_step(log jsonb, step text, since float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN log IS NULL OR jsonb_array_length(log) = 0 OR (log -> -1) ? 'ended_at'
                THEN log
                ELSE jsonb_set(log, '{-1}', ((log -> -1) - 'step' - 'step_started_at')
                    || jsonb_strip_nulls(jsonb_build_object('step', step, 'step_started_at', since)))
           END
$$;
