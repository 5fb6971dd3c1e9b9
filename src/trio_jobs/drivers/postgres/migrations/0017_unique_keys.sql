-- 0017: job(unique_for=). A row enqueued by a job declaring unique_for carries
-- unique_key = true; once it settles, its key stays taken for the enqueuer's
-- unique_for, found through the partial index below. Every other row leaves the
-- column NULL and never enters the index, so their enqueues and settles pay
-- nothing for it.
ALTER TABLE trio_jobs_jobs ADD COLUMN unique_key boolean;

CREATE INDEX trio_jobs_jobs_unique_settled_idx
    ON trio_jobs_jobs (name, idempotency_key, tenant_id, updated_at)
    WHERE unique_key AND state IN ('done', 'failed', 'dead', 'cancelled');
