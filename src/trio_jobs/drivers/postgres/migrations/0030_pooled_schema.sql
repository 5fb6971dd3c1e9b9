-- 0030: a statement behind a transaction-mode pooler (PgBouncer) names its
-- schema itself (the driver qualifies every trio_jobs_* name) instead of leaning
-- on a search_path set at connect, which a pooler drops. A SQL function is
-- inlined with the caller's search_path, so a function whose body names
-- another trio-jobs object unqualified would find it in the wrong schema, or
-- nowhere. trio_jobs_attempt_read was the one: it called trio_jobs_attempt_end.
-- Its body now spells that closing out, so it names nothing and stays inlined.
CREATE OR REPLACE FUNCTION trio_jobs_attempt_read(log jsonb, state text, settled_at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN state <> 'done' OR log IS NULL OR jsonb_array_length(log) = 0
                     OR (log -> -1) ? 'ended_at'
                THEN log
                ELSE jsonb_set(log, '{-1}', (log -> -1) || jsonb_strip_nulls(jsonb_build_object(
                    'ended_at', settled_at, 'outcome', 'done')))
           END
$$;
