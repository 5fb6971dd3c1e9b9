-- 0025: the per-minute counter row, sharded.
--
-- Every settle statement (the ack combiner's ack_many, a nack that counts, a claim
-- that buries) upserts the row of its minute and job name. With several of them
-- in flight (a worker sends two ack batches at once, and a fleet has many
-- workers) each waited on that one row for the previous statement's commit: the
-- first serialization point under load (benchmarks/README.md, "Many processes").
-- The row is now one of 16 per (bucket, name): a statement writes the shard of its
-- server backend (`mod(pg_backend_pid(), 16)`), so two connections rarely meet, and
-- every reader sums over the shards (the counters query groups by bucket and
-- name already).
ALTER TABLE trio_jobs_counters ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE trio_jobs_counters DROP CONSTRAINT trio_jobs_counters_pkey;
ALTER TABLE trio_jobs_counters ADD PRIMARY KEY (bucket, name, shard);
