-- 0031: the per-minute counters row, sharded.
--
-- Every settle upserts the (minute, job name) row of trio_jobs_counters in the
-- settle's own transaction, so every worker process settling jobs of one name
-- in one minute queued on that one row: at 16 and 32 processes every lock
-- waiter the fleet benchmark sampled was an ack waiting on it
-- (benchmarks/README.md, "fleet scale"). A write now lands in one of 16 rows of
-- its minute and name, chosen by the server backend's pid (mod(pg_backend_pid(), 16):
-- one connection keeps to one row, and connections spread over them,
-- through a pooler too); the readers already sum a minute's rows.
ALTER TABLE trio_jobs_counters ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE trio_jobs_counters DROP CONSTRAINT trio_jobs_counters_pkey;
ALTER TABLE trio_jobs_counters ADD PRIMARY KEY (bucket, name, shard);
