-- 0007: rate limits (rate_limiter()): one row per (limiter name, key) holding the
-- acquisitions granted in its last window, oldest first (epoch seconds on the
-- database's clock). An acquisition is one upsert that locks the row, so
-- acquirers in every process of the fleet take turns on it (see rate.sql).
CREATE TABLE trio_jobs_rate_limits (
    name    text NOT NULL,
    key     text NOT NULL,
    -- the granted acquisitions still in the window as of `at`, oldest first
    hits    float8[] NOT NULL,
    -- the last decision: granted or not, and when
    granted boolean NOT NULL,
    at      float8 NOT NULL,
    PRIMARY KEY (name, key)
);
