-- 0004: a run that met a busy concurrency key waits on it. The worker hands it
-- back with `busy_key` set (the lease key, while a live slot of it is held) and
-- a due time a visibility timeout out: the bound for a wake that never comes.
-- Every release of a slot (a settle, a reap, a cancel, a purge, an explicit
-- release: each deletes the lease row) makes the first run waiting on its key,
-- by priority then enqueue order, due at once, instead of every worker claiming
-- it again each poll to find the key still busy.
ALTER TABLE trio_jobs_jobs ADD COLUMN busy_key text;

CREATE INDEX trio_jobs_jobs_busy_idx
    ON trio_jobs_jobs (busy_key, priority, seq)
    WHERE busy_key IS NOT NULL;

-- Due "at once" is the instant of its hand-back (`updated_at`), which is never
-- later than now by the clock that wrote it, so no clock is read here. SKIP
-- LOCKED: a waiter some claim holds right now is being taken anyway. The
-- function keeps the search_path it was created under (this schema's), so a
-- delete made under another search_path still wakes this schema's waiters.
CREATE FUNCTION trio_jobs_wake_waiter() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE trio_jobs_jobs j SET run_at = least(j.run_at, j.updated_at), busy_key = NULL
    WHERE j.id = (
        SELECT w.id FROM trio_jobs_jobs w
        WHERE w.busy_key = OLD.lease_key AND w.state = 'ready'
        ORDER BY w.priority, w.seq
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER trio_jobs_leases_wake_waiter
    AFTER DELETE ON trio_jobs_leases
    FOR EACH ROW EXECUTE FUNCTION trio_jobs_wake_waiter();
