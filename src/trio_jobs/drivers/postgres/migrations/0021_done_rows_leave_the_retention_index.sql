-- 0021: an ack enters no retention index.
--
-- A row that settles done used to enter trio_jobs_jobs_settled_idx (terminal
-- rows by updated_at), one of the three index entries its ack's new tuple
-- writes. The index now holds the rarer endings only (failed, dead,
-- cancelled); the purge finds expired done rows through the listing index
-- (created_at, id) instead: a row settles after it was created, so every
-- done row settled before the cut was created before it too.
DROP INDEX trio_jobs_jobs_settled_idx;
CREATE INDEX trio_jobs_jobs_settled_idx
    ON trio_jobs_jobs (updated_at)
    WHERE state IN ('failed', 'dead', 'cancelled');
