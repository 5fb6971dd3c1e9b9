-- The webhook ledger (migration 0012): postgres_webhook_ledger().

-- name: webhook_record
-- Append one attempt and apply its effect to the endpoint's row, in one
-- statement: 'ok' resets the count, 'fail' adds one and stamps disabled_at
-- once the count reaches disable_after, 'none' leaves both. Answers whether
-- the endpoint is disabled now.
WITH a AS (
    INSERT INTO trio_jobs_webhook_attempts
        (endpoint_id, event_id, attempt, status, code, at, duration_ms)
    VALUES (%(endpoint_id)s, %(event_id)s, %(attempt)s, %(status)s, %(code)s, %(at)s,
            %(duration_ms)s)
)
INSERT INTO trio_jobs_webhook_endpoints AS e
    (endpoint_id, consecutive_failures, disabled_at, last_attempt_at)
VALUES (
    %(endpoint_id)s,
    CASE WHEN %(effect)s = 'fail' THEN 1 ELSE 0 END,
    CASE WHEN %(effect)s = 'fail' AND 1 >= %(disable_after)s THEN %(at)s END,
    %(at)s
)
ON CONFLICT (endpoint_id) DO UPDATE SET
    consecutive_failures = CASE %(effect)s
        WHEN 'fail' THEN e.consecutive_failures + 1
        WHEN 'ok' THEN 0
        ELSE e.consecutive_failures END,
    disabled_at = CASE
        WHEN e.disabled_at IS NOT NULL THEN e.disabled_at
        WHEN %(effect)s = 'fail' AND e.consecutive_failures + 1 >= %(disable_after)s THEN %(at)s
        END,
    last_attempt_at = greatest(e.last_attempt_at, excluded.last_attempt_at)
RETURNING disabled_at IS NOT NULL;

-- name: webhook_is_disabled
SELECT disabled_at IS NOT NULL FROM trio_jobs_webhook_endpoints
WHERE endpoint_id = %(endpoint_id)s;

-- name: webhook_enable
UPDATE trio_jobs_webhook_endpoints SET consecutive_failures = 0, disabled_at = NULL
WHERE endpoint_id = %(endpoint_id)s;

-- name: webhook_attempts
-- The newest `limit` attempts (of one endpoint and/or event), oldest first.
SELECT endpoint_id, event_id, attempt, status, code, at, duration_ms FROM (
    SELECT * FROM trio_jobs_webhook_attempts
    WHERE (%(endpoint_id)s::text IS NULL OR endpoint_id = %(endpoint_id)s)
      AND (%(event_id)s::text IS NULL OR event_id = %(event_id)s)
    ORDER BY at DESC, id DESC
    LIMIT %(limit)s
) newest
ORDER BY at, id;

-- name: webhook_endpoints
SELECT endpoint_id, consecutive_failures, disabled_at, last_attempt_at
FROM trio_jobs_webhook_endpoints
ORDER BY endpoint_id
LIMIT %(limit)s;
