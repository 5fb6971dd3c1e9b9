-- 0010: rate limits spread the refused and their rows are purged.
--
-- A refusal of a full window takes a place in the row's queue instead of being
-- told the instant the oldest grant leaves (where every refused run would meet
-- again): `base` is the window's grants when the queue opened and `queued` how
-- many places it has promised; place n comes back at
-- base[n % limit] + per * (1 + n / limit) (see rate.sql and drivers/_window.py).
-- `retry_after` is the last decision's answer. `expires_at` is when the row
-- holds nothing the limiter needs (its last grant has left the window and its
-- last promise has passed): the retention purge deletes it then. A row written
-- before this migration does not say its window, so it is kept until its next
-- acquisition sets one ('Infinity').
ALTER TABLE trio_jobs_rate_limits
    ADD COLUMN base        float8[] NOT NULL DEFAULT '{}',
    ADD COLUMN queued      bigint NOT NULL DEFAULT 0,
    ADD COLUMN retry_after float8 NOT NULL DEFAULT 0,
    ADD COLUMN expires_at  float8 NOT NULL DEFAULT 'Infinity';
