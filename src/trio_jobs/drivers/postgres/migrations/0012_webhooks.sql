-- 0012: the webhook ledger (postgres_webhook_ledger()): one row per delivery
-- attempt of a webhook() job, and one per endpoint with its consecutive
-- failures and disabled mark.
--
-- An attempt row is appended once per attempt, before the attempt's verdict
-- (so a failure the ledger cannot see cannot escape the disable count).
-- `status` is the HTTP status the endpoint answered (null: refused before
-- sending, or no answer); `code` the X_* code the attempt failed with (null:
-- a 2xx). The endpoint row is written by the same statement: a 2xx resets
-- `consecutive_failures`, a failed or rejected delivery adds one, and the write
-- that brings it to the job's disable_after stamps `disabled_at`, which only
-- the app's enable() clears. Nothing deletes rows: retention is the app's.
CREATE TABLE trio_jobs_webhook_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id text NOT NULL,
    event_id    text NOT NULL,
    attempt     integer NOT NULL CHECK (attempt >= 0),
    status      integer,
    code        text,
    at          float8 NOT NULL,
    duration_ms float8 NOT NULL CHECK (duration_ms >= 0)
);
-- ledger.attempts(endpoint_id=...), ledger.attempts(event_id=...), and the newest overall.
CREATE INDEX trio_jobs_webhook_attempts_endpoint_idx
    ON trio_jobs_webhook_attempts (endpoint_id, at DESC, id DESC);
CREATE INDEX trio_jobs_webhook_attempts_event_idx
    ON trio_jobs_webhook_attempts (event_id, at DESC, id DESC);
CREATE INDEX trio_jobs_webhook_attempts_at_idx ON trio_jobs_webhook_attempts (at DESC, id DESC);
CREATE TABLE trio_jobs_webhook_endpoints (
    endpoint_id          text PRIMARY KEY,
    consecutive_failures integer NOT NULL CHECK (consecutive_failures >= 0),
    disabled_at          float8,
    last_attempt_at      float8 NOT NULL
);
