-- trio-jobs check on PostgreSQL (testing/_pg_ground.py): its crash runs share
-- one throwaway schema, emptied before each run. Nothing here runs on an app's
-- own schema: the reset refuses any schema the gate did not name.

-- name: check_reset
-- The library's tables by DELETE (small, and cheaper so than a TRUNCATE); the
-- app's own (made by its trio_jobs_setup hook) in one TRUNCATE ... CASCADE, so
-- their foreign keys never order the emptying.
DO $$
DECLARE t text;
DECLARE app text;
BEGIN
    IF current_schema() NOT LIKE 'trio\_jobs\_check\_%' THEN
        RAISE EXCEPTION 'trio-jobs check empties only its own throwaway schema, not %', current_schema();
    END IF;
    FOR t IN
        SELECT tablename FROM pg_tables
        WHERE schemaname = current_schema() AND tablename LIKE 'trio\_jobs\_%'
          AND tablename <> 'trio_jobs_migrations'
    LOOP
        EXECUTE format('DELETE FROM %I.%I', current_schema(), t);
    END LOOP;
    SELECT string_agg(format('%I.%I', current_schema(), tablename), ', ') INTO app FROM pg_tables
    WHERE schemaname = current_schema() AND tablename NOT LIKE 'trio\_jobs\_%';
    IF app IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || app || ' CASCADE';
    END IF;
END $$;

-- name: check_next_wake
-- When the next live row is due: its lease's end while running, else its run_at.
SELECT min(CASE WHEN state = 'running' THEN lease_expires_at ELSE run_at END)
FROM trio_jobs_jobs
WHERE state IN ('ready', 'delayed', 'running', 'suspended');

-- name: check_started_step
-- Whether a killed run left a once step started and never ended.
SELECT EXISTS (SELECT 1 FROM trio_jobs_steps WHERE status = 'started');
