-- 0030: a statement behind a transaction-mode pooler (PgBouncer) names its
-- schema itself (the driver qualifies every trio_jobs_* name) instead of leaning
-- on a search_path set at connect, which a pooler drops. A SQL function is
-- inlined with the caller's search_path, so a function whose body names
-- another trio-jobs object unqualified would find it in the wrong schema, or
-- nowhere. trio_jobs_attempt_view (0020) was the one: it called
-- trio_jobs_attempt_push. Its body now spells that push out, so it names
-- nothing and stays inlined.
CREATE OR REPLACE FUNCTION trio_jobs_attempt_view(log jsonb, attempt integer, worker text, at float8,
    step text, step_at float8, state text, settled_at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN at IS NULL THEN log
        ELSE (CASE WHEN jsonb_array_length(coalesce(log, '[]'::jsonb)) >= 20 THEN log - 0
                   ELSE coalesce(log, '[]'::jsonb) END)
            || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                'attempt', attempt, 'worker_id', worker, 'started_at', at,
                'step', step, 'step_started_at', step_at,
                'ended_at', CASE WHEN state = 'done' THEN settled_at END,
                'outcome', CASE WHEN state = 'done' THEN 'done' END)))
    END
$$;
