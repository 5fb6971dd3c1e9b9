-- The backfill ledger (migration 0008): one row per backfill() pass.

-- name: backfill_record
-- Write one page of a pass: create its row (started now), or move it forward.
-- An existing row takes the write only when `pages` is at least its own;
-- `name` and `started_at` keep their first values, and `finished_at` is
-- stamped once, by the first write of the last page.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now)
INSERT INTO trio_jobs_backfills AS b (job_id, name, pages, items, cursor, started_at, finished_at)
SELECT %(job_id)s, %(name)s, %(pages)s, %(items)s, %(cursor)s::json, n.now,
       CASE WHEN %(finished)s THEN n.now END
FROM n
ON CONFLICT (job_id) DO UPDATE SET
    pages = excluded.pages,
    items = excluded.items,
    cursor = excluded.cursor,
    finished_at = coalesce(b.finished_at, excluded.finished_at)
    WHERE excluded.pages >= b.pages;

-- name: backfill_list
-- The newest `limit` rows, of one backfill when `name` is given.
SELECT name, job_id::text, pages, items, cursor, started_at, finished_at
FROM trio_jobs_backfills
WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY started_at DESC, job_id DESC
LIMIT %(limit)s;

-- name: backfill_rows
-- The rows of the passes `ids` (job ids; those the ledger holds).
SELECT name, job_id::text, pages, items, cursor, started_at, finished_at
FROM trio_jobs_backfills
WHERE job_id = ANY(%(ids)s::uuid[]);
