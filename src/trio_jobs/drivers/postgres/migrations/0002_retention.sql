-- Retention: the hourly purge finds terminal rows by when they settled, through
-- this index instead of a scan of the whole table.
CREATE INDEX trio_jobs_jobs_settled_idx
    ON trio_jobs_jobs (updated_at)
    WHERE state IN ('done', 'failed', 'dead', 'cancelled');
