-- 0008: the backfill ledger: one row per backfill() pass, keyed by its job.
--
-- A pass's page steps write it, each page after its handle ran and before its
-- checkpoint: absolute values that only move forward (pages never goes down),
-- so a page written twice leaves the row as one write would. `cursor` is
-- where the next page starts (`json`: the text the pass stored), null once the
-- last page was handled; `finished_at` is stamped then, once. Rows are kept
-- when their jobs are purged: the ledger is the history of the passes.
CREATE TABLE trio_jobs_backfills (
    job_id      uuid PRIMARY KEY,
    name        text NOT NULL,
    pages       integer NOT NULL CHECK (pages >= 0),
    items       bigint NOT NULL CHECK (items >= 0),
    cursor      json,
    started_at  float8 NOT NULL,
    finished_at float8
);
-- `jobs.backfills()` and `trio-jobs backfills`: newest first.
CREATE INDEX trio_jobs_backfills_started_idx ON trio_jobs_backfills (started_at DESC, job_id DESC);
