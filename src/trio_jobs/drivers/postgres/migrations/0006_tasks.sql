-- 0006: scheduled tasks (task()). One row per task a scheduler registered: its
-- schedule as declared (an operator reads it without the declaration), the
-- watermark (every occurrence at or before it is decided: fired or skipped),
-- the last occurrence that fired and when, and the lease of the process that
-- leads it. A fire moves the watermark and inserts the occurrences' job rows in
-- one statement, fenced on the lease and on the watermark the leader read
-- (sql/tasks.sql). Pauses stay in trio_jobs_task_pauses (0001).
CREATE TABLE trio_jobs_tasks (
    name             text PRIMARY KEY,
    schedule         text NOT NULL,
    tz               text NOT NULL,
    catch_up         text NOT NULL CHECK (catch_up IN ('latest', 'all', 'none')),
    queue            text NOT NULL,
    watermark        float8 NOT NULL,
    armed_at         float8 NOT NULL,
    last_fire        float8,
    fired_at         float8,
    leader           text,
    lease_expires_at float8,
    updated_at       float8 NOT NULL
);
