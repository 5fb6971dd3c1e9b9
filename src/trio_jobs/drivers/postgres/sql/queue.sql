-- The queue: enqueue, claim, settle, heartbeat, stats.
--
-- Every query is one statement (one round trip, atomic by itself). `%(now)s` is
-- NULL in production (the database's clock) and a float only under a test clock.
-- Each named query starts at a `-- name:` line and runs to the next one.
--
-- One lock order (docs/explanation/design-choices.md): a statement that may wait
-- for several job rows locks them in id order, in a `locked` CTE whose lock sits
-- above its sort, and its write joins only `locked`, so it writes no row it did
-- not lock in that order. Counter rows come after every job row (an aggregate
-- reads them all first), in (bucket, name) order; a statement writes one shard of
-- each (`mod(pg_backend_pid(), 16)`, migration 0031), so another connection's
-- statement rarely waits on the same row. A job's lease and step rows
-- are written only under its row's lock, so they follow it. SKIP LOCKED never
-- waits, and so needs no order; nor does trio_jobs_wake_waiter, which fires at
-- the end of a statement that deleted lease rows and takes one waiter row each
-- time, SKIP LOCKED.

-- name: enqueue_many
-- Up to 1,000 requests in one statement, sent as one JSON array (`rows`): one
-- parameter, parsed by the server, instead of fourteen arrays. A column every
-- request of the batch shares (the job's name, queue, attempts, priority, ...)
-- comes once as its own parameter and is absent from the rows, so the server
-- parses only what varies (a fifth less per statement, benchmarks/README.md);
-- a column that varies comes in every row, and its parameter is NULL. The caller has
-- already folded inputs sharing a live key (the first one stands for all), so
-- every input here has its own (name, tenant_id, idempotency_key). An input is
-- inserted unless a live row holds its key or its id is already a row (a
-- republish) — ON CONFLICT DO NOTHING over both unique indexes.
--
-- The answer names only what the caller cannot know: a first row (ordinal 0)
-- with the queues this statement inserted a due row into and the queues it
-- announced (a transactional pg_notify, only for queues the caller's 250 ms
-- throttle allowed, only for rows due now), then one row per input that did
-- not insert, naming the row that holds it, deduped. Every other input
-- inserted its own id: no row to send back and decode (a batch of fresh
-- inputs answers one row, not 1,000). A NULL `found` means the holder
-- committed after this statement's snapshot: the caller asks again.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT t.ord, t.id, t.run_id, coalesce(t.name, %(name)s) AS name,
        coalesce(t.queue, %(queue)s) AS queue, t.payload,
        coalesce(t.tenant_id, %(tenant_id)s) AS tenant_id, t.idempotency_key,
        coalesce(t.concurrency_key, %(concurrency_key)s) AS concurrency_key,
        coalesce(t.max_attempts, %(max_attempts)s::int) AS max_attempts,
        coalesce(t.priority, %(priority)s::int) AS priority,
        coalesce(t.run_at, %(run_at)s::float8) AS run_at,
        coalesce(t.delay, %(delay)s::float8) AS delay,
        coalesce(t.actor, %(actor)s::json) AS actor,
        coalesce(t.trace_context, %(trace_context)s::json) AS trace_context,
        coalesce(t.sensitive, %(sensitive)s::bool) AS sensitive,
        -- a step's children (sql/children.sql): NULL for every other row
        coalesce(t.parent_id, %(parent_id)s::uuid) AS parent_id,
        coalesce(t.parent_wait, %(parent_wait)s::uuid) AS parent_wait
    FROM json_to_recordset(%(rows)s::json) AS t(
        ord int, id uuid, run_id uuid, name text, queue text, payload json, tenant_id text,
        idempotency_key text, concurrency_key text, max_attempts int, priority int,
        run_at float8, delay float8, actor json, trace_context json, sensitive boolean,
        parent_id uuid, parent_wait uuid)
),
ins AS (
    INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, tenant_id, idempotency_key,
        concurrency_key, max_attempts, priority, state, run_at, created_at, updated_at, actor,
        trace_context, sensitive, parent_id, parent_wait)
    SELECT i.id, i.run_id, i.name, i.queue, i.payload, i.tenant_id, i.idempotency_key,
        i.concurrency_key, i.max_attempts, i.priority,
        CASE WHEN r.run_at <= n.now THEN 'ready' ELSE 'delayed' END,
        r.run_at, n.now, n.now, i.actor, i.trace_context, coalesce(i.sensitive, false),
        i.parent_id, i.parent_wait
    FROM input i
    CROSS JOIN n
    CROSS JOIN LATERAL (SELECT coalesce(i.run_at, n.now + coalesce(i.delay, 0)) AS run_at) r
    ORDER BY i.ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, state
),
notified AS (
    SELECT s.queue, pg_notify(%(channel)s, s.queue)
    FROM (SELECT DISTINCT queue FROM ins
          WHERE state = 'ready' AND queue = ANY(%(notify)s::text[])) s
)
SELECT 0, NULL::text[],
    (SELECT array_agg(DISTINCT queue) FROM ins WHERE state = 'ready'),
    (SELECT array_agg(queue) FROM notified)
UNION ALL
SELECT i.ord,
    coalesce(
        -- per-row index lookups, only for the inputs that did not insert
        (SELECT ARRAY[j.id::text, j.run_id::text] FROM trio_jobs_jobs j
         WHERE j.name = i.name AND j.idempotency_key = i.idempotency_key
           AND j.tenant_id IS NOT DISTINCT FROM i.tenant_id
           AND j.state IN ('ready', 'delayed', 'running', 'suspended')
         LIMIT 1),
        (SELECT ARRAY[j.id::text, j.run_id::text] FROM trio_jobs_jobs j WHERE j.id = i.id)),
    NULL, NULL
FROM input i
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = i.id);

-- name: enqueue_fresh
-- enqueue_many's first try for a batch: the same rows and parameters, inserted
-- by trio_jobs_enqueue_fresh (migration 0032) as a plain INSERT in an exception
-- block, without ON CONFLICT's probe and speculative insertion of every row.
-- `ready` is the queues it inserted a due row into, `notified` those of them
-- announced (as enqueue_many announces them); a NULL `ready` means an input's
-- key is held or its id known: nothing was written, nothing announced, and the
-- caller sends enqueue_many.
SELECT f.ready,
    (SELECT array_agg(s.q)
     FROM (SELECT q, pg_notify(%(channel)s, q) FROM unnest(f.ready) AS q
           WHERE q = ANY(%(notify)s::text[])) s) AS notified
FROM (SELECT trio_jobs_enqueue_fresh(%(rows)s::json, %(now)s::float8, %(name)s::text,
    %(queue)s::text, %(tenant_id)s::text, %(concurrency_key)s::text, %(max_attempts)s::int,
    %(priority)s::int, %(run_at)s::float8, %(delay)s::float8, %(actor)s::json,
    %(trace_context)s::json, %(sensitive)s::bool, %(parent_id)s::uuid,
    %(parent_wait)s::uuid) AS ready) f;

-- name: enqueue_one
-- One request, the common case (an `enqueue` in a request handler): the same
-- insert as enqueue_many with scalar parameters instead of a JSON array, as one
-- plain INSERT (no CTE: each one costs the server a materialised scan, and the
-- statement is run per call). The driver sends it straight through libpq
-- (`Database.fetch_text`: text parameters, prepared once per session on a
-- direct connection), which is why it names every parameter's type. It answers
-- a row only when it inserted; a held key or a known id answers nothing, and the
-- caller asks enqueue_many, which names the holder. The pg_notify rides along in
-- RETURNING, evaluated only for the inserted row, when the caller's 250 ms
-- throttle allows it (`notify`) and the row is due now: `notified` is true then.
INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, tenant_id, idempotency_key,
    concurrency_key, max_attempts, priority, state, run_at, created_at, updated_at, actor,
    trace_context, sensitive, parent_id, parent_wait)
SELECT %(id)s::uuid, %(run_id)s::uuid, %(name)s::text, %(queue)s::text, %(payload)s::json,
    %(tenant_id)s::text, %(key)s::text, %(ckey)s::text, %(max_attempts)s::int,
    %(priority)s::int, CASE WHEN t.run_at <= t.now THEN 'ready' ELSE 'delayed' END,
    t.run_at, t.now, t.now, %(actor)s::json, %(trace_context)s::json, %(sensitive)s::bool,
    %(parent_id)s::uuid, %(parent_wait)s::uuid
FROM (
    SELECT n.now, coalesce(%(run_at)s::float8, n.now + coalesce(%(delay)s::float8, 0)) AS run_at
    FROM (SELECT trio_jobs_now(%(now)s::float8) AS now) n
) t
ON CONFLICT DO NOTHING
RETURNING state,
    CASE WHEN state = 'ready' AND %(notify)s::bool
        THEN (SELECT true FROM pg_notify(%(channel)s::text, queue)) END AS notified;

-- name: enqueue_keyed
-- One request of a job declaring debounce= or unique_for= (jobs without either
-- never reach it: their enqueues stay the two statements above). It locks the
-- key's live row, if any: a debounced request moves a row that was never
-- claimed (no attempt entry, ready or delayed, not waiting on a busy key) to
-- `debounce` after now with this input, and any live row answers deduped. With
-- no live row, a unique_for request answers the newest row of the key that
-- settled less than `unique_for` ago (enqueued with unique_for: unique_key),
-- deduped. Otherwise it inserts. No row answered means a concurrent enqueue of
-- the key committed after this statement's snapshot: the caller asks again.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
live AS (
    SELECT j.id, j.run_id,
        j.attempt_log IS NULL AND j.attempt_at IS NULL AND j.state IN ('ready', 'delayed')
            AND j.busy_key IS NULL AS movable
    FROM trio_jobs_jobs j
    WHERE j.name = %(name)s AND j.idempotency_key = %(key)s
      AND j.tenant_id IS NOT DISTINCT FROM %(tenant_id)s
      AND j.state IN ('ready', 'delayed', 'running', 'suspended')
    FOR NO KEY UPDATE OF j
),
moved AS (
    UPDATE trio_jobs_jobs j
    SET payload = %(payload)s::json, concurrency_key = %(ckey)s, state = 'delayed',
        run_at = n.now + %(debounce)s::float8, updated_at = n.now
    FROM live, n
    WHERE j.id = live.id AND live.movable AND %(debounce)s::float8 IS NOT NULL
    RETURNING j.id
),
settled AS (
    SELECT j.id, j.run_id
    FROM trio_jobs_jobs j, n
    WHERE %(unique_for)s::float8 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM live)
      AND j.unique_key AND j.state IN ('done', 'failed', 'dead', 'cancelled')
      AND j.name = %(name)s AND j.idempotency_key = %(key)s
      AND j.tenant_id IS NOT DISTINCT FROM %(tenant_id)s
      AND j.updated_at > n.now - %(unique_for)s::float8
    ORDER BY j.updated_at DESC
    LIMIT 1
),
ins AS (
    INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, tenant_id, idempotency_key,
        concurrency_key, max_attempts, priority, state, run_at, created_at, updated_at, actor,
        trace_context, sensitive, unique_key, parent_id, parent_wait)
    SELECT %(id)s::uuid, %(run_id)s::uuid, %(name)s, %(queue)s, %(payload)s::json,
        %(tenant_id)s, %(key)s, %(ckey)s, %(max_attempts)s::int, %(priority)s::int,
        CASE WHEN r.run_at <= n.now THEN 'ready' ELSE 'delayed' END, r.run_at, n.now, n.now,
        %(actor)s::json, %(trace_context)s::json, %(sensitive)s::bool,
        CASE WHEN %(unique_for)s::float8 IS NOT NULL THEN true END, %(parent_id)s::uuid,
        %(parent_wait)s::uuid
    FROM n
    CROSS JOIN LATERAL (
        SELECT coalesce(%(run_at)s::float8,
            n.now + coalesce(%(debounce)s::float8, %(delay)s::float8, 0)) AS run_at
    ) r
    WHERE NOT EXISTS (SELECT 1 FROM live) AND NOT EXISTS (SELECT 1 FROM settled)
    ON CONFLICT DO NOTHING
    RETURNING id, run_id, state
)
SELECT ins.id::text, ins.run_id::text, false, ins.state FROM ins
UNION ALL
SELECT live.id::text, live.run_id::text, true, NULL FROM live
UNION ALL
SELECT settled.id::text, settled.run_id::text, true, NULL FROM settled;

-- name: claim_ready
-- The claim's common case, one statement: no lease has lapsed, so nothing is
-- reaped, and the waiting rows are taken as `claim` takes them (the same
-- order, the same SKIP LOCKED, the same columns answered). What it leaves out
-- is what `claim` runs for lapsed leases whether or not there are any (the
-- reoffer, the burial, their lease deletes and counters: four writing CTEs the
-- executor sets up on every call, ~20% of a small claim's server CPU,
-- benchmarks/README.md). When a lease has lapsed by `now` (one probe of the
-- lease index) it takes nothing and answers a 'reap' row, and the driver sends
-- `claim` at once: a lapsed row is still reaped by the first claim after its
-- lapse, and may be taken by it, as before.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
reap AS (
    SELECT EXISTS (
        SELECT 1 FROM trio_jobs_jobs j
        WHERE j.state = 'running' AND j.lease_expires_at <= (SELECT now FROM n)
    ) AS due
),
want AS (
    SELECT w.queue, w.take, w.ord
    FROM unnest(%(queues)s::text[], %(takes)s::int[]) WITH ORDINALITY AS w(queue, take, ord)
    WHERE w.take > 0 AND NOT (SELECT due FROM reap)
      AND NOT EXISTS (SELECT 1 FROM trio_jobs_queue_pauses p WHERE p.queue = w.queue)
),
waiting AS (
    SELECT c.*, want.ord AS qord
    FROM want
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.seq, j.promoted, j.lapsed
        FROM trio_jobs_jobs j
        WHERE j.queue = want.queue
          AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.run_at <= (SELECT now FROM n)
        ORDER BY j.priority, j.run_at, j.seq
        LIMIT want.take
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) c
),
-- numbered as `claim` numbers its picks (and the join below is then planned
-- as the few rows it is: a nested loop by primary key, not a hash of the table)
pick AS (
    SELECT c.* FROM (
        SELECT w.*, row_number() OVER (PARTITION BY w.qord ORDER BY w.priority, w.run_at, w.seq) AS rn
        FROM waiting w
    ) c
    JOIN want ON want.ord = c.qord
    WHERE c.rn <= want.take
),
-- a waiting row is never running, so no open attempt entry is pushed here
claimed AS (
    UPDATE trio_jobs_jobs j SET
        state = 'running',
        attempts = j.attempts + 1,
        worker_id = %(worker_id)s,
        claim = nextval('trio_jobs_claim_seq'),
        lease_expires_at = n.now + %(visibility)s,
        updated_at = n.now,
        waiting_event = NULL,
        busy_key = NULL,
        promoted = false,
        lapsed = false,
        attempt_at = n.now, attempt_worker = %(worker_id)s, attempt_step = NULL,
        attempt_step_at = NULL
    FROM pick p, n
    WHERE j.id = p.id
    RETURNING j.id, j.run_id, j.name, j.queue, j.payload, j.tenant_id, j.idempotency_key,
        j.concurrency_key, j.attempts, j.max_attempts, j.worker_id, j.claim, j.created_at,
        j.run_at, j.lease_expires_at, j.actor, j.trace_context, p.promoted, p.lapsed,
        p.qord, p.rn
),
seen AS (
    UPDATE trio_jobs_workers w SET
        last_heartbeat = n.now, expires_at = n.now + %(registry_ttl)s::float8
    FROM n
    WHERE w.id = %(worker_id)s AND %(registry_ttl)s::float8 IS NOT NULL
      AND w.expires_at > n.now
    RETURNING w.id
)
SELECT 'job' AS kind, c.id::text, c.run_id::text, c.name, c.queue, c.payload, c.tenant_id,
    c.idempotency_key, c.concurrency_key, c.attempts, c.max_attempts, c.worker_id, c.claim,
    c.created_at, c.run_at, c.lease_expires_at, c.actor, c.trace_context, c.promoted, c.lapsed,
    NULL AS state, NULL AS error_code, NULL AS last_error, c.qord, c.rn,
    coalesce((
        SELECT json_agg(json_build_array(s.name, s.status, s.seq, s.executions, s.output,
            s.error, s.error_code, s.wake_at, s.event, s.since, s.deadline, s.started_at,
            s.ended_at) ORDER BY s.seq)
        FROM trio_jobs_steps s WHERE s.job_id = c.id), '[]'::json) AS steps
FROM claimed c
UNION ALL
SELECT 'seen', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM seen
UNION ALL
SELECT 'reap', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM reap WHERE reap.due
ORDER BY 1 DESC, 24, 25;

-- name: claim
-- One pass of a worker: up to `takes[k]` rows of `queues[k]` (unpaused queues
-- only), best first by (priority, run_at, seq), locked with SKIP LOCKED so
-- concurrent claimers never meet. In the same statement every running row whose
-- lease lapsed is reaped: on its final attempt it is buried (dead, or failed for
-- the `drop` names) and answered as `exhausted`; otherwise it is offered again,
-- due at its lapse, and may be taken by this very pass. A reaped row's
-- concurrency leases are released; burials move the counters. Each claimed
-- row carries its step records. Every job row it locks is taken SKIP LOCKED:
-- the claim never waits for one, so their order does not matter.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
want AS (
    SELECT w.queue, w.take, w.ord
    FROM unnest(%(queues)s::text[], %(takes)s::int[]) WITH ORDINALITY AS w(queue, take, ord)
    WHERE w.take > 0
      AND NOT EXISTS (SELECT 1 FROM trio_jobs_queue_pauses p WHERE p.queue = w.queue)
),
lapsed AS (
    SELECT j.id, j.queue, j.priority, j.lease_expires_at AS run_at, j.seq,
        j.attempts >= j.max_attempts AS final
    FROM trio_jobs_jobs j
    WHERE j.state = 'running' AND j.lease_expires_at <= (SELECT now FROM n)
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
waiting AS (
    SELECT c.*, want.ord AS qord
    FROM want
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.priority, j.run_at, j.seq, j.promoted, j.lapsed
        FROM trio_jobs_jobs j
        WHERE j.queue = want.queue
          AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.run_at <= (SELECT now FROM n)
        ORDER BY j.priority, j.run_at, j.seq
        LIMIT want.take
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) c
),
candidates AS (
    SELECT w.id, w.qord, w.priority, w.run_at, w.seq, w.promoted, w.lapsed FROM waiting w
    UNION ALL
    SELECT l.id, want.ord, l.priority, l.run_at, l.seq, false, true
    FROM lapsed l JOIN want ON want.queue = l.queue
    WHERE NOT l.final
),
pick AS (
    SELECT c.* FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.qord ORDER BY c.priority, c.run_at, c.seq) AS rn
        FROM candidates c
    ) c
    JOIN want ON want.ord = c.qord
    WHERE c.rn <= want.take
),
claimed AS (
    UPDATE trio_jobs_jobs j SET
        state = 'running',
        attempts = j.attempts + 1,
        worker_id = %(worker_id)s,
        claim = nextval('trio_jobs_claim_seq'),
        run_at = p.run_at,
        lease_expires_at = n.now + %(visibility)s,
        updated_at = n.now,
        waiting_event = NULL,
        busy_key = NULL,
        promoted = false,
        lapsed = false,
        -- the new attempt's entry, open in scalar columns (no jsonb is built);
        -- a lapsed row taken back at once pushes its previous entry first
        attempt_log = CASE WHEN j.state = 'running' THEN trio_jobs_attempt_push(j.attempt_log,
            j.attempts, j.attempt_worker, j.attempt_at, j.attempt_step, j.attempt_step_at,
            n.now, 'lapsed', 'X_JOB_LEASE_LOST', %(lapsed_line)s) ELSE j.attempt_log END,
        attempt_at = n.now, attempt_worker = %(worker_id)s, attempt_step = NULL,
        attempt_step_at = NULL
    FROM pick p, n
    WHERE j.id = p.id
    RETURNING j.id, j.run_id, j.name, j.queue, j.payload, j.tenant_id, j.idempotency_key,
        j.concurrency_key, j.attempts, j.max_attempts, j.worker_id, j.claim, j.created_at,
        j.run_at, j.lease_expires_at, j.actor, j.trace_context, p.promoted, p.lapsed,
        p.qord, p.rn
),
reoffered AS (
    UPDATE trio_jobs_jobs j SET
        state = 'ready', run_at = l.run_at, worker_id = NULL, claim = NULL,
        promoted = false, lapsed = true, updated_at = n.now,
        attempt_log = trio_jobs_attempt_push(j.attempt_log, j.attempts, j.attempt_worker,
            j.attempt_at, j.attempt_step, j.attempt_step_at, n.now, 'lapsed', 'X_JOB_LEASE_LOST',
            %(lapsed_line)s),
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM lapsed l, n
    WHERE j.id = l.id AND NOT l.final AND NOT EXISTS (SELECT 1 FROM pick p WHERE p.id = l.id)
),
buried AS (
    UPDATE trio_jobs_jobs j SET
        state = CASE WHEN j.name = ANY(%(drop_names)s::text[]) THEN 'failed' ELSE 'dead' END,
        error_code = 'X_JOB_LEASE_LOST',
        last_error = format(%(lapse_message)s, j.attempts, j.max_attempts),
        worker_id = NULL, claim = NULL, updated_at = n.now,
        attempt_log = trio_jobs_attempt_push(j.attempt_log, j.attempts, j.attempt_worker,
            j.attempt_at, j.attempt_step, j.attempt_step_at, n.now, 'lapsed', 'X_JOB_LEASE_LOST',
            %(lapsed_line)s),
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM lapsed l, n
    WHERE j.id = l.id AND l.final
    RETURNING j.id, j.run_id, j.name, j.queue, j.payload, j.tenant_id, j.state, j.error_code,
        j.last_error, n.now, j.attempts
),
freed AS (
    DELETE FROM trio_jobs_leases s USING lapsed l WHERE s.job_id = l.id
),
counted AS (
    INSERT INTO trio_jobs_counters AS c (bucket, name, shard, dead, failed, queue)
    SELECT floor(b.now / 60) * 60, b.name, mod(pg_backend_pid(), 16)::smallint,
        count(*) FILTER (WHERE b.state = 'dead'), count(*) FILTER (WHERE b.state = 'failed'),
        max(b.queue)
    FROM buried b GROUP BY 1, 2, 3
    ORDER BY 1, 2
    ON CONFLICT (bucket, name, shard) DO UPDATE
        SET dead = c.dead + excluded.dead, failed = c.failed + excluded.failed,
            queue = excluded.queue
),
-- The worker registry's liveness rides on the claim: the claimer's live row (if
-- the driver recorded one, `registry_ttl`) is renewed here, so an idle worker's
-- unchanged record_worker costs no statement of its own (see record_worker).
seen AS (
    UPDATE trio_jobs_workers w SET
        last_heartbeat = n.now, expires_at = n.now + %(registry_ttl)s::float8
    FROM n
    WHERE w.id = %(worker_id)s AND %(registry_ttl)s::float8 IS NOT NULL
      AND w.expires_at > n.now
    RETURNING w.id
)
-- ids as text: the driver hands out str ids, and a uuid object per id costs the
-- claimer ~4 us a row to build and format again.
SELECT 'job' AS kind, c.id::text, c.run_id::text, c.name, c.queue, c.payload, c.tenant_id,
    c.idempotency_key, c.concurrency_key, c.attempts, c.max_attempts, c.worker_id, c.claim,
    c.created_at, c.run_at, c.lease_expires_at, c.actor, c.trace_context, c.promoted, c.lapsed,
    NULL AS state, NULL AS error_code, NULL AS last_error, c.qord, c.rn,
    -- the run's step records ride along: a replay needs no second round trip
    coalesce((
        SELECT json_agg(json_build_array(s.name, s.status, s.seq, s.executions, s.output,
            s.error, s.error_code, s.wake_at, s.event, s.since, s.deadline, s.started_at,
            s.ended_at) ORDER BY s.seq)
        FROM trio_jobs_steps s WHERE s.job_id = c.id), '[]'::json) AS steps
FROM claimed c
UNION ALL
SELECT 'exhausted', b.id::text, b.run_id::text, b.name, b.queue, b.payload, b.tenant_id,
    NULL, NULL, b.attempts, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    b.state, b.error_code, b.last_error, NULL, NULL, NULL
FROM buried b
UNION ALL
SELECT 'seen', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM seen
ORDER BY 1 DESC, 24, 25;

-- name: ack_many
-- Fenced completions, many in one statement (the settle combiner): only the
-- claim's holder, while its lease holds. The rows' concurrency leases go and
-- the `done` counters move in the same statement. Answers the ordinals that
-- landed. The completions come as one JSON array (`rows`, absent keys read as
-- NULL), parsed faster than six typed arrays.
--
-- A settled row keeps its `claim` (worker_id goes): claim numbers are unique, a
-- claim's own settle is the only write that leaves a row not running with that
-- claim (the reap and a cancel clear it, the next claim replaces it), so it
-- names the settle that landed. An input flagged `again` is the retry of an ack
-- whose answer never came (the connection dropped; it may have committed): when
-- its row is no longer running and still carries its claim, that ack landed,
-- and it answers landed again, moving nothing twice (`again` below).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS t(
        ord int, id uuid, worker_id text, claim int8, result text, progress text,
        duration float8, again boolean)
),
-- The fenced rows, locked in id order (one lock order); the UPDATE touches only these.
-- Each request finds its row by primary key, the requests taken in id order (a
-- nested loop over the sorted input: its locks are taken in that order). Not a
-- join: planned generically, a join of the requests to the running rows became
-- a hash of every running row of the fleet (the lease index answers them all),
-- per statement, so an ack's cost grew with the fleet's held rows, not its own
-- (benchmarks/README.md, "The fenced statements by primary key"). The lease
-- and state checks stay outside the locked read (OFFSET 0 keeps them there: a
-- state or lease check inside would let the planner read the lease index
-- instead of the key); a row it locked and they refuse is left as it was.
locked AS MATERIALIZED (
    SELECT j.id, i.ord, i.result, i.progress, i.duration
    FROM (SELECT * FROM input ORDER BY id) i
    CROSS JOIN LATERAL (
        SELECT j.id, j.state, j.lease_expires_at FROM trio_jobs_jobs j
        WHERE j.id = i.id AND j.worker_id = i.worker_id AND j.claim = i.claim
        OFFSET 0
        FOR NO KEY UPDATE OF j
    ) j
    WHERE j.state = 'running' AND j.lease_expires_at > (SELECT now FROM n)
),
hit AS (
    UPDATE trio_jobs_jobs j SET
        state = 'done', result = l.result::json, worker_id = NULL,
        updated_at = n.now, progress = coalesce(l.progress::json, j.progress)
        -- the attempt's entry stays open in its columns: readers close a done
        -- row's with its updated_at (trio_jobs_attempt_view)
    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.id, j.name, j.queue, l.ord, l.duration, n.now
),
-- One index lookup per flagged input, none for the others (a scalar subquery,
-- not a join: the planner cannot turn it into a scan of the jobs table). The
-- statement's snapshot precedes `hit`, so a row this statement settles is not
-- seen here as well.
again AS (
    SELECT i.ord FROM input i
    WHERE i.again AND coalesce((
        SELECT j.state <> 'running' AND j.claim = i.claim
        FROM trio_jobs_jobs j WHERE j.id = i.id), false)
),
-- A released slot makes the first run waiting on its key due (the trigger
-- trio_jobs_wake_waiter): each landed row answers its queue when it held one,
-- so the driver wakes its own idle workers on that queue.
freed AS (
    DELETE FROM trio_jobs_leases s USING hit WHERE s.job_id = hit.id
    RETURNING s.job_id
),
counted AS (
    INSERT INTO trio_jobs_counters AS c (bucket, name, shard, done, duration, queue)
    SELECT floor(hit.now / 60) * 60, hit.name, mod(pg_backend_pid(), 16)::smallint, count(*),
        coalesce(sum(hit.duration), 0),
        max(hit.queue)
    FROM hit GROUP BY 1, 2, 3
    ORDER BY 1, 2
    ON CONFLICT (bucket, name, shard) DO UPDATE
        SET done = c.done + excluded.done, duration = c.duration + excluded.duration,
            queue = excluded.queue
)
-- `IN`, not a correlated EXISTS: one hashed pass over `freed`, where EXISTS
-- scanned it again for every landed row (500 acks holding a lease each: 28.8 ->
-- 20.3 ms of server CPU, benchmarks/README.md)
SELECT ord, CASE WHEN hit.id IN (SELECT f.job_id FROM freed f) THEN queue END
FROM hit
UNION ALL
SELECT ord, NULL FROM again;

-- name: ack_many_unkept
-- ack_many for a driver that keeps no done rows (`done_retention=0`): the
-- same fence, lock order, leases and counters, but a row that settles done is
-- DELETEd with its step rows in the same statement (no new row version, no
-- index entry). Kept as ack_many keeps it: a child (`parent_id`: its parent's
-- step.invoke / step.gather reads its result from the row) and a row of a
-- unique_for= key (the settled row is what keeps the key taken). The retry of
-- an ack whose answer never came (`again`) answers landed when its row still
-- carries its claim (as in ack_many) or is gone: the only statements that
-- delete a row delete a settled one, so a gone row's job is done.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS t(
        ord int, id uuid, worker_id text, claim int8, result text, progress text,
        duration float8, again boolean)
),
-- (the fenced rows by primary key in id order, as in ack_many)
locked AS MATERIALIZED (
    SELECT j.id, i.ord, i.result, i.progress, i.duration,
        j.parent_id IS NOT NULL OR coalesce(j.unique_key, false) AS kept
    FROM (SELECT * FROM input ORDER BY id) i
    CROSS JOIN LATERAL (
        SELECT j.id, j.state, j.lease_expires_at, j.parent_id, j.unique_key
        FROM trio_jobs_jobs j
        WHERE j.id = i.id AND j.worker_id = i.worker_id AND j.claim = i.claim
        OFFSET 0
        FOR NO KEY UPDATE OF j
    ) j
    WHERE j.state = 'running' AND j.lease_expires_at > (SELECT now FROM n)
),
kept AS (
    UPDATE trio_jobs_jobs j SET
        state = 'done', result = l.result::json, worker_id = NULL,
        updated_at = n.now, progress = coalesce(l.progress::json, j.progress)
    FROM locked l, n
    WHERE j.id = l.id AND l.kept
    RETURNING j.id, j.name, j.queue, l.ord, l.duration, n.now
),
gone AS (
    DELETE FROM trio_jobs_jobs j USING locked l, n
    WHERE j.id = l.id AND NOT l.kept
    RETURNING j.id, j.name, j.queue, l.ord, l.duration, n.now
),
hit AS (
    SELECT * FROM kept UNION ALL SELECT * FROM gone
),
steps_gone AS (
    DELETE FROM trio_jobs_steps s USING gone WHERE s.job_id = gone.id
),
again AS (
    SELECT i.ord FROM input i
    WHERE i.again AND coalesce((
        SELECT j.state <> 'running' AND j.claim = i.claim
        FROM trio_jobs_jobs j WHERE j.id = i.id), true)
),
freed AS (
    DELETE FROM trio_jobs_leases s USING hit WHERE s.job_id = hit.id
    RETURNING s.job_id
),
counted AS (
    INSERT INTO trio_jobs_counters AS c (bucket, name, shard, done, duration, queue)
    SELECT floor(hit.now / 60) * 60, hit.name, mod(pg_backend_pid(), 16)::smallint, count(*),
        coalesce(sum(hit.duration), 0),
        max(hit.queue)
    FROM hit GROUP BY 1, 2, 3
    ORDER BY 1, 2
    ON CONFLICT (bucket, name, shard) DO UPDATE
        SET done = c.done + excluded.done, duration = c.duration + excluded.duration,
            queue = excluded.queue
)
SELECT ord, CASE WHEN hit.id IN (SELECT f.job_id FROM freed f) THEN queue END
FROM hit
UNION ALL
SELECT ord, NULL FROM again;

-- name: nack
-- The fenced hand-back. Live again (ready/delayed/suspended, due at `run_at` or
-- now + `delay`) or for good (dead/failed). `counted = false` gives the attempt
-- back. Leases released, counters moved and, when the row is due now, its queue
-- announced, all in the same statement. The row keeps its `claim`, and `again`
-- (the retry of a nack whose answer never came) recognises a hand-back that
-- already landed, as in ack_many: it answers landed and moves nothing twice.
-- `busy_key` (a busy-key hand-back): while a live slot of that key is held the
-- row waits on it (a release makes it due: trio_jobs_wake_waiter); a key that
-- came free since the busy acquire makes it due at once.
-- One job row, then its leases, then one counter row: nothing to order.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
busy AS (
    SELECT EXISTS (
        SELECT 1 FROM trio_jobs_leases s, n
        WHERE s.lease_key = %(busy_key)s::text AND s.expires_at > n.now
    ) AS held
),
hit AS (
    UPDATE trio_jobs_jobs j SET
        attempts = j.attempts - CASE WHEN %(counted)s THEN 0 ELSE 1 END,
        max_attempts = greatest(j.max_attempts, coalesce(%(max_attempts)s::int, j.max_attempts)),
        progress = coalesce(%(progress)s::json, j.progress),
        error_code = CASE WHEN %(set_error)s THEN %(error_code)s::text ELSE j.error_code END,
        last_error = CASE WHEN %(set_error)s THEN %(last_error)s::text ELSE j.last_error END,
        worker_id = NULL, updated_at = n.now,
        state = %(state)s,
        run_at = CASE WHEN %(final)s THEN j.run_at
                      WHEN %(busy_key)s::text IS NOT NULL AND NOT b.held THEN n.now
                      ELSE coalesce(%(run_at)s::float8, n.now + coalesce(%(delay)s::float8, 0)) END,
        waiting_event = CASE WHEN %(final)s THEN j.waiting_event ELSE %(waiting_event)s::text END,
        busy_key = CASE WHEN b.held THEN %(busy_key)s::text END,
        attempt_log = trio_jobs_attempt_push(j.attempt_log, j.attempts, j.attempt_worker,
            j.attempt_at, j.attempt_step, j.attempt_step_at, n.now, %(outcome)s,
            %(attempt_code)s::text, %(attempt_error)s::text),
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM n, busy b
    WHERE j.id = %(id)s AND j.state = 'running' AND j.worker_id = %(worker_id)s
      AND j.claim = %(claim)s AND j.lease_expires_at > n.now
    RETURNING j.id, j.name, j.queue, j.run_at, n.now
),
freed AS (
    DELETE FROM trio_jobs_leases s USING hit WHERE s.job_id = hit.id
    RETURNING s.job_id
),
counted AS (
    INSERT INTO trio_jobs_counters AS c (bucket, name, shard, retried, failed, dead, duration, queue)
    SELECT floor(hit.now / 60) * 60, hit.name, mod(pg_backend_pid(), 16)::smallint,
        %(c_retried)s, %(c_failed)s, %(c_dead)s,
        coalesce(%(duration)s::float8, 0), hit.queue
    FROM hit
    WHERE %(c_retried)s + %(c_failed)s + %(c_dead)s > 0
    ON CONFLICT (bucket, name, shard) DO UPDATE SET
        retried = c.retried + excluded.retried, failed = c.failed + excluded.failed,
        dead = c.dead + excluded.dead, duration = c.duration + excluded.duration,
        queue = excluded.queue
),
notified AS (
    SELECT pg_notify(%(channel)s, hit.queue) FROM hit
    WHERE NOT %(final)s AND hit.run_at <= hit.now AND NOT (hit.queue = ANY(%(quiet)s::text[]))
),
again AS (
    SELECT j.queue, j.run_at, n.now FROM trio_jobs_jobs j, n
    WHERE %(again)s::bool AND j.id = %(id)s AND j.state <> 'running' AND j.claim = %(claim)s
),
landed AS (
    SELECT queue, run_at, now FROM hit
    UNION ALL
    SELECT queue, run_at, now FROM again
)
SELECT count(*), (SELECT count(*) FROM notified), min(queue), min(run_at), min(now),
    (SELECT count(*) FROM freed)
FROM landed;

-- name: release_orphans
-- Rows running under this worker with a live lease and a claim it does not hold:
-- a claim whose answer never reached it took them. Handed back uncounted, due now,
-- their leases released (a released slot wakes its key's first waiter), locked in
-- id order (one lock order). A worker sends it only after a claim failed.
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
orphans AS MATERIALIZED (
    SELECT j.id FROM trio_jobs_jobs j
    WHERE j.state = 'running' AND j.worker_id = %(worker_id)s
      AND NOT (j.claim = ANY(%(held)s::int8[]))
      AND j.lease_expires_at > (SELECT now FROM n)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
released AS (
    UPDATE trio_jobs_jobs j SET
        state = 'ready', attempts = j.attempts - 1, worker_id = NULL, claim = NULL,
        run_at = n.now, updated_at = n.now,
        error_code = 'X_DRIVER_UNAVAILABLE', last_error = %(message)s,
        attempt_log = trio_jobs_attempt_push(j.attempt_log, j.attempts, j.attempt_worker,
            j.attempt_at, j.attempt_step, j.attempt_step_at, n.now, 'handed-back',
            'X_DRIVER_UNAVAILABLE', %(line)s),
        attempt_at = NULL, attempt_worker = NULL, attempt_step = NULL, attempt_step_at = NULL
    FROM orphans o, n
    WHERE j.id = o.id
    RETURNING j.id, j.queue
),
freed AS (
    DELETE FROM trio_jobs_leases s USING released r WHERE s.job_id = r.id
)
SELECT r.id::text, r.queue FROM released r ORDER BY r.id;

-- name: heartbeat
-- Renew every held row's lease, and its concurrency leases, in one statement.
-- Answers the ordinal of each renewed row ('ok') and of each row an operator
-- cancelled ('cancelled'); the driver reads every other request as 'lost'.
-- No join back from the requests to what was renewed: the planner, expecting
-- one row from each side, made it a nested loop, quadratic in the batch (16 ms
-- for 300 held rows; a renewal's cost must follow the rows a worker holds).
WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(worker_ids)s::text[], %(claims)s::int8[],
        %(progress)s::text[], %(steps)s::text[], %(step_since)s::float8[])
        WITH ORDINALITY AS t(id, worker_id, claim, progress, step, step_since, ord)
),
-- The fenced rows, locked in id order (one lock order); the UPDATE touches only these.
-- Each by primary key, the requests in id order (as in ack_many, and why).
locked AS MATERIALIZED (
    SELECT j.id, i.progress, i.step, i.step_since, i.ord
    FROM (SELECT * FROM input ORDER BY id) i
    CROSS JOIN LATERAL (
        SELECT j.id, j.state, j.lease_expires_at FROM trio_jobs_jobs j
        WHERE j.id = i.id AND j.worker_id = i.worker_id AND j.claim = i.claim
        OFFSET 0
        FOR NO KEY UPDATE OF j
    ) j
    WHERE j.state = 'running' AND j.lease_expires_at > (SELECT now FROM n)
),
renewed AS (
    UPDATE trio_jobs_jobs j SET
        lease_expires_at = n.now + %(visibility)s,
        progress = coalesce(l.progress::json, j.progress),
        -- the step in progress, on the open entry's columns
        attempt_step = l.step, attempt_step_at = l.step_since
    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.id, j.worker_id, j.claim, l.ord
),
leases AS (
    UPDATE trio_jobs_leases s SET expires_at = n.now + %(visibility)s
    FROM renewed r, n
    WHERE s.job_id = r.id AND s.worker_id = r.worker_id AND s.claim = r.claim
)
SELECT r.ord, 'ok' FROM renewed r
UNION ALL
-- one index probe per request not renewed (its row may be gone: then it is
-- lost): a scalar subquery, not EXISTS, which the planner made a hash of every
-- failed, dead and cancelled row (the retention index answers them all) per
-- heartbeat
SELECT i.ord, 'cancelled' FROM input i
WHERE i.ord NOT IN (SELECT r.ord FROM renewed r) AND coalesce((
    SELECT j.state = 'cancelled' AND j.worker_id IS NULL
    FROM trio_jobs_jobs j WHERE j.id = i.id), false);

-- name: stats
SELECT queue, state, count(*) FROM trio_jobs_jobs GROUP BY queue, state ORDER BY queue;

-- name: now
SELECT trio_jobs_now(%(now)s);
