-- 0032: a batch of fresh inputs inserts without ON CONFLICT's speculative
-- insertion.
--
-- ON CONFLICT DO NOTHING probes both unique indexes (the primary key and the
-- live key) before each row, inserts it speculatively, and confirms it with a
-- WAL record of its own: ~a quarter of the server's CPU for a batch of 1,000
-- fresh inputs (benchmarks/README.md, "2026-12-03 (fourth session)"). This
-- function inserts the batch as a plain INSERT, whose index inserts check
-- uniqueness on their own way down, inside an exception block: the first held
-- key or known id rolls the block's subtransaction back (nothing is written,
-- and the caught error is not logged) and answers NULL, and the driver sends
-- the batch through enqueue_many's ON CONFLICT statement, which names the
-- holders. Otherwise it answers the queues it inserted a due row into.
CREATE FUNCTION trio_jobs_enqueue_fresh(
    p_rows json, p_now float8, p_name text, p_queue text, p_tenant_id text,
    p_concurrency_key text, p_max_attempts integer, p_priority integer, p_run_at float8,
    p_delay float8, p_actor json, p_trace_context json, p_sensitive boolean,
    p_parent_id uuid, p_parent_wait uuid
) RETURNS text[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    at float8 := trio_jobs_now(p_now);
    ready text[];
BEGIN
    WITH ins AS (
        INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, tenant_id,
            idempotency_key, concurrency_key, max_attempts, priority, state, run_at,
            created_at, updated_at, actor, trace_context, sensitive, parent_id, parent_wait)
        SELECT t.id, t.run_id, coalesce(t.name, p_name), coalesce(t.queue, p_queue), t.payload,
            coalesce(t.tenant_id, p_tenant_id), t.idempotency_key,
            coalesce(t.concurrency_key, p_concurrency_key),
            coalesce(t.max_attempts, p_max_attempts), coalesce(t.priority, p_priority),
            CASE WHEN r.run_at <= at THEN 'ready' ELSE 'delayed' END, r.run_at, at, at,
            coalesce(t.actor, p_actor), coalesce(t.trace_context, p_trace_context),
            coalesce(t.sensitive, p_sensitive, false), coalesce(t.parent_id, p_parent_id),
            coalesce(t.parent_wait, p_parent_wait)
        FROM json_to_recordset(p_rows) AS t(
            ord int, id uuid, run_id uuid, name text, queue text, payload json, tenant_id text,
            idempotency_key text, concurrency_key text, max_attempts int, priority int,
            run_at float8, delay float8, actor json, trace_context json, sensitive boolean,
            parent_id uuid, parent_wait uuid)
        CROSS JOIN LATERAL (
            SELECT coalesce(t.run_at, p_run_at,
                at + coalesce(t.delay, p_delay, 0)) AS run_at
        ) r
        ORDER BY t.ord
        RETURNING trio_jobs_jobs.queue AS queue, trio_jobs_jobs.state AS state
    )
    SELECT coalesce(array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'ready'), '{}')
    INTO ready
    FROM ins;
    RETURN ready;
EXCEPTION WHEN unique_violation THEN
    RETURN NULL;
END
$$;
