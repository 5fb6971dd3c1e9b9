-- 0003: the row says whether its job was declared `sensitive=True`, so a reader
-- holding no job handle (the `trio-jobs` CLI) still redacts the payload, the
-- keys and the step outputs. NULL: a row enqueued before this column existed,
-- or by an older trio-jobs; readers treat it as sensitive.
ALTER TABLE trio_jobs_jobs ADD COLUMN sensitive boolean;
