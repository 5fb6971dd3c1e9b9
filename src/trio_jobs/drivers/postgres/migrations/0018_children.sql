-- 0018: child jobs (step.invoke / step.gather). A child names its parent
-- (parent_id). The parent counts its live children (children_pending): a
-- child's insert counts it up, a child leaving the live states (or removed)
-- counts it down in the settle's own statement, each under the parent's row
-- lock, so two last children settling together cannot both miss the zero. The
-- last one makes a parent suspended on them (wait_children) due at once; the
-- parent's suspended hand-back is due at once when none is live as it lands.
-- Cancelling a parent cancels its live children, in the same statement.
ALTER TABLE trio_jobs_jobs ADD COLUMN parent_id uuid;
ALTER TABLE trio_jobs_jobs ADD COLUMN children_pending integer NOT NULL DEFAULT 0;
ALTER TABLE trio_jobs_jobs ADD COLUMN wait_children boolean NOT NULL DEFAULT false;

CREATE INDEX trio_jobs_jobs_parent_idx
    ON trio_jobs_jobs (parent_id, created_at)
    WHERE parent_id IS NOT NULL;

CREATE FUNCTION trio_jobs_child_added() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE trio_jobs_jobs p SET children_pending = p.children_pending + 1
    WHERE p.id = NEW.parent_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER trio_jobs_jobs_child_added
    AFTER INSERT ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL)
    EXECUTE FUNCTION trio_jobs_child_added();

CREATE FUNCTION trio_jobs_child_settled() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    at float8;
BEGIN
    IF TG_OP = 'DELETE' THEN
        at := OLD.updated_at;
        UPDATE trio_jobs_jobs p SET children_pending = p.children_pending - 1,
            run_at = CASE WHEN p.children_pending <= 1 AND p.state = 'suspended'
                               AND p.wait_children THEN least(p.run_at, at) ELSE p.run_at END
        WHERE p.id = OLD.parent_id;
        RETURN NULL;
    END IF;
    IF NEW.parent_id IS NOT NULL AND NEW.state NOT IN ('ready', 'delayed', 'running', 'suspended') THEN
        UPDATE trio_jobs_jobs p SET children_pending = p.children_pending - 1,
            run_at = CASE WHEN p.children_pending <= 1 AND p.state = 'suspended'
                               AND p.wait_children THEN least(p.run_at, NEW.updated_at)
                          ELSE p.run_at END
        WHERE p.id = NEW.parent_id;
    END IF;
    IF NEW.state = 'cancelled' THEN
        -- a cancelled parent cancels its live children (each fires this again)
        UPDATE trio_jobs_jobs c SET state = 'cancelled', worker_id = NULL, claim = NULL,
            error_code = 'X_ABORTED', last_error = 'X_ABORTED: cancelled: its parent was cancelled',
            updated_at = NEW.updated_at,
            attempt_log = CASE WHEN c.state = 'running' THEN trio_jobs_attempt_end(c.attempt_log,
                NEW.updated_at, 'cancelled', 'X_ABORTED', 'its parent was cancelled')
                ELSE c.attempt_log END
        WHERE c.parent_id = NEW.id AND c.state IN ('ready', 'delayed', 'running', 'suspended');
        DELETE FROM trio_jobs_leases s USING trio_jobs_jobs c
        WHERE s.job_id = c.id AND c.parent_id = NEW.id AND c.state = 'cancelled';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER trio_jobs_jobs_child_settled
    AFTER UPDATE OF state ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.state IN ('ready', 'delayed', 'running', 'suspended')
          AND NEW.state NOT IN ('ready', 'delayed', 'running', 'suspended')
          AND (NEW.parent_id IS NOT NULL OR NEW.state = 'cancelled'))
    EXECUTE FUNCTION trio_jobs_child_settled();

CREATE TRIGGER trio_jobs_jobs_child_removed
    AFTER DELETE ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.parent_id IS NOT NULL AND OLD.state IN ('ready', 'delayed', 'suspended'))
    EXECUTE FUNCTION trio_jobs_child_settled();
