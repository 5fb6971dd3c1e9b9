-- The trio-jobs schema: what replaying every migration gives.
--
-- Times are float8 seconds since the Unix epoch, decided by the database's clock
-- (see trio_jobs_now below): the protocol speaks float seconds, and a float8
-- column gives back exactly the value it was given. Payloads, results and step
-- outputs are `json`, not `jsonb`: `json` keeps the text (key order included)
-- that the body stored, so a replay reads back exactly what the first run read.

-- The database's now, in epoch seconds; a test may pass an override.
CREATE FUNCTION trio_jobs_now(override float8 DEFAULT NULL) RETURNS float8
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(override, extract(epoch FROM clock_timestamp())::float8) $$;

CREATE SEQUENCE trio_jobs_claim_seq;

CREATE TABLE trio_jobs_jobs (
    id               uuid PRIMARY KEY,
    run_id           uuid NOT NULL,
    name             text NOT NULL,
    queue            text NOT NULL,
    payload          json,
    tenant_id        text,
    idempotency_key  text NOT NULL,
    concurrency_key  text,
    max_attempts     integer NOT NULL,
    priority         integer NOT NULL DEFAULT 0,
    seq              bigserial NOT NULL,
    state            text NOT NULL DEFAULT 'ready'
        CHECK (state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'failed', 'dead', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    run_at           float8 NOT NULL,
    created_at       float8 NOT NULL,
    updated_at       float8 NOT NULL,
    -- the fence: who holds the claim, and which claim
    worker_id        text,
    claim            bigint,
    lease_expires_at float8,
    error_code       text,
    last_error       text,
    progress         json,
    result           json,
    actor            json,
    trace_context    json,
    waiting_event    text,
    promoted         boolean NOT NULL DEFAULT false,
    lapsed           boolean NOT NULL DEFAULT false,
    -- declared sensitive=True (NULL: enqueued before 0003; read as sensitive)
    sensitive        boolean,
    -- the concurrency lease key this ready row waits on (a busy-key hand-back)
    busy_key         text,
    -- the attempts that ended otherwise than done, newest 20, oldest first
    -- (trio_jobs_attempt_push); NULL: none yet
    attempt_log      jsonb,
    -- enqueued by a job declaring unique_for= (NULL otherwise): its key stays
    -- taken after it settles (0017)
    unique_key       boolean,
    -- the open attempt (0020): when it was claimed (NULL: none open), by whom,
    -- and the step its last heartbeat reported
    attempt_at       float8,
    attempt_worker   text,
    attempt_step     text,
    attempt_step_at  float8
);

-- One live row per (name, tenant, key): the dedupe. A NULL tenant is one tenant
-- (NULLS NOT DISTINCT, PostgreSQL 15+). The key leads the tenant so a lookup by
-- (name, key) is an index range even when the tenant is compared IS NOT DISTINCT.
CREATE UNIQUE INDEX trio_jobs_jobs_name_tenant_idempotency_live_idx
    ON trio_jobs_jobs (name, idempotency_key, tenant_id) NULLS NOT DISTINCT
    WHERE state IN ('ready', 'delayed', 'running', 'suspended');

-- The claim: waiting rows of a queue in (priority, run_at, seq) order.
CREATE INDEX trio_jobs_jobs_claim_idx
    ON trio_jobs_jobs (queue, priority, run_at, seq)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- The reap: running rows by lease expiry.
CREATE INDEX trio_jobs_jobs_lease_idx
    ON trio_jobs_jobs (lease_expires_at)
    WHERE state = 'running';

-- Events wake the runs suspended on them.
CREATE INDEX trio_jobs_jobs_waiting_idx
    ON trio_jobs_jobs (waiting_event)
    WHERE state = 'suspended';

-- Listing, newest first (keyset on (created_at, id)).
CREATE INDEX trio_jobs_jobs_created_idx ON trio_jobs_jobs (created_at, id);

-- Retention (the hourly purge): failed, dead and cancelled rows by when they
-- settled. Done rows are not in it (0021: an ack writes no entry here); the
-- purge finds them through the listing index, created_at before the cut.
CREATE INDEX trio_jobs_jobs_settled_idx
    ON trio_jobs_jobs (updated_at)
    WHERE state IN ('failed', 'dead', 'cancelled');

-- unique_for=: the settled rows of a key that stays taken, newest last.
CREATE INDEX trio_jobs_jobs_unique_settled_idx
    ON trio_jobs_jobs (name, idempotency_key, tenant_id, updated_at)
    WHERE unique_key AND state IN ('done', 'failed', 'dead', 'cancelled');

CREATE TABLE trio_jobs_steps (
    -- no foreign key: a step write is fenced on its job row already, and the
    -- statements that delete a job delete its steps in the same statement
    job_id     uuid NOT NULL,
    name       text NOT NULL,
    status     text NOT NULL CHECK (status IN ('started', 'completed', 'failed', 'sleeping', 'waiting')),
    seq        integer NOT NULL,
    executions integer NOT NULL DEFAULT 0,
    output     json,
    error      text,
    error_code text,
    wake_at    float8,
    event      text,
    since      float8,
    deadline   float8,
    started_at float8,
    ended_at   float8,
    PRIMARY KEY (job_id, name)
);

-- Fleet-wide concurrency: one row per held slot.
CREATE TABLE trio_jobs_leases (
    lease_key  text NOT NULL,
    slot       integer NOT NULL,
    job_id     uuid NOT NULL,
    worker_id  text NOT NULL,
    claim      bigint NOT NULL,
    expires_at float8 NOT NULL,
    PRIMARY KEY (lease_key, slot)
);
CREATE INDEX trio_jobs_leases_job_idx ON trio_jobs_leases (job_id);

-- Runs waiting on a busy key, first by priority then enqueue order.
CREATE INDEX trio_jobs_jobs_busy_idx
    ON trio_jobs_jobs (busy_key, priority, seq)
    WHERE busy_key IS NOT NULL;

-- A released slot makes the first run waiting on its key due at once (at the
-- instant of its hand-back: no clock is read here).
CREATE FUNCTION trio_jobs_wake_waiter() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE trio_jobs_jobs j SET run_at = least(j.run_at, j.updated_at), busy_key = NULL
    WHERE j.id = (
        SELECT w.id FROM trio_jobs_jobs w
        WHERE w.busy_key = OLD.lease_key AND w.state = 'ready'
        ORDER BY w.priority, w.seq
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER trio_jobs_leases_wake_waiter
    AFTER DELETE ON trio_jobs_leases
    FOR EACH ROW EXECUTE FUNCTION trio_jobs_wake_waiter();

-- Push an entry onto a log (at NULL: nothing to push, the log as it was),
-- keeping the newest 20. `ended` NULL pushes it open (a reader's view of a
-- running attempt).
CREATE FUNCTION trio_jobs_attempt_push(log jsonb, attempt integer, worker text, at float8,
    step text, step_at float8, ended float8, outcome text, code text, message text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN at IS NULL THEN log
        ELSE (CASE WHEN jsonb_array_length(coalesce(log, '[]'::jsonb)) >= 20 THEN log - 0
                   ELSE coalesce(log, '[]'::jsonb) END)
            || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                'attempt', attempt, 'worker_id', worker, 'started_at', at,
                'step', step, 'step_started_at', step_at, 'ended_at', ended,
                'outcome', outcome, 'error_code', code, 'error', message)))
    END
$$;

-- The log as readers see it: the pushed entries, then the open one (ended as
-- done at the row's settle time when the row is done). It spells
-- trio_jobs_attempt_push's body out (0030): its body names no other trio-jobs
-- object, since an inlined SQL function resolves names on the caller's
-- search_path, which a pooled statement does not set.
CREATE FUNCTION trio_jobs_attempt_view(log jsonb, attempt integer, worker text, at float8,
    step text, step_at float8, state text, settled_at float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN at IS NULL THEN log
        ELSE (CASE WHEN jsonb_array_length(coalesce(log, '[]'::jsonb)) >= 20 THEN log - 0
                   ELSE coalesce(log, '[]'::jsonb) END)
            || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                'attempt', attempt, 'worker_id', worker, 'started_at', at,
                'step', step, 'step_started_at', step_at,
                'ended_at', CASE WHEN state = 'done' THEN settled_at END,
                'outcome', CASE WHEN state = 'done' THEN 'done' END)))
    END
$$;

CREATE TABLE trio_jobs_events (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL,
    payload      json,
    published_at float8 NOT NULL
);
CREATE INDEX trio_jobs_events_name_idx ON trio_jobs_events (name, published_at);

CREATE TABLE trio_jobs_workers (
    id             text PRIMARY KEY,
    host           text NOT NULL,
    pid            integer NOT NULL,
    started_at     float8 NOT NULL,
    queues         text[] NOT NULL,
    slots          json NOT NULL,
    in_flight      text[] NOT NULL DEFAULT '{}',
    last_heartbeat float8 NOT NULL,
    expires_at     float8 NOT NULL
);

-- History: one row per (minute, job name); read back in the spec's tiers.
CREATE TABLE trio_jobs_counters (
    bucket   float8 NOT NULL,
    name     text NOT NULL,
    done     integer NOT NULL DEFAULT 0,
    retried  integer NOT NULL DEFAULT 0,
    failed   integer NOT NULL DEFAULT 0,
    dead     integer NOT NULL DEFAULT 0,
    duration float8 NOT NULL DEFAULT 0,
    -- the queue the job settled in (NULL: written before 0005)
    queue    text,
    -- which of 16 rows of the minute and name this write landed in (the
    -- server backend's pid modulo 16): readers sum over it (0031)
    shard    smallint NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, name, shard)
);

CREATE TABLE trio_jobs_queue_pauses (
    queue     text PRIMARY KEY,
    paused_at float8 NOT NULL
);

CREATE TABLE trio_jobs_task_pauses (
    task      text PRIMARY KEY,
    paused_at float8 NOT NULL
);

-- The transactional outbox, for a queue that does not live in the app's database.
CREATE TABLE trio_jobs_outbox (
    seq          bigserial PRIMARY KEY,
    id           uuid NOT NULL UNIQUE,
    request      json NOT NULL,
    queue        text NOT NULL,
    staged_at    float8 NOT NULL,
    lease_until  float8,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    published_at float8
);
CREATE INDEX trio_jobs_outbox_pending_idx ON trio_jobs_outbox (seq) WHERE published_at IS NULL;

-- Rate limits (rate_limiter()), since 0007: one row per (limiter name, key)
-- holding the acquisitions granted in its last window, oldest first.
CREATE TABLE trio_jobs_rate_limits (
    name    text NOT NULL,
    key     text NOT NULL,
    -- the granted acquisitions still in the window as of `at`, oldest first
    hits    float8[] NOT NULL,
    -- the last decision: granted or not, and when
    granted boolean NOT NULL,
    at      float8 NOT NULL,
    -- the queue of the refused (0010): the window's grants when it opened, and
    -- how many places it has promised
    base        float8[] NOT NULL DEFAULT '{}',
    queued      bigint NOT NULL DEFAULT 0,
    -- the last decision's answer: the seconds until the refused one's turn
    retry_after float8 NOT NULL DEFAULT 0,
    -- when the row holds nothing the limiter needs: the retention purge's cut
    expires_at  float8 NOT NULL DEFAULT 'Infinity',
    PRIMARY KEY (name, key)
);

-- The backfill ledger (0008): one row per backfill() pass, keyed by its job.
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
-- Scheduled tasks (0006): the schedule as declared, the watermark (occurrences at
-- or before it are decided), the last fire, and the leader's lease.
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
-- The webhook ledger (0012): one row per delivery attempt of a webhook() job,
-- and one per endpoint with its consecutive failures and disabled mark.
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

-- 0018: child jobs (step.invoke / step.gather). A child names its parent
-- (parent_id, for `show` and the cancel cascade) and the wait it belongs to
-- (parent_wait: one per step that enqueued children, its first child's id).
-- Every column is NULL on a row that is no child, and the triggers below are
-- filtered by WHEN on it, so the other rows' settles pay nothing for them.
--
-- A wait counts its children that have not settled (trio_jobs_child_waits,
-- pending). The parent's hand-back on its children marks its wait `waiting`
-- (children_wait in sql/children.sql); the last child's settle then makes the
-- parent due, in the settle's own statement. Counting and waking keep the one
-- lock order (docs/explanation/design-choices.md): a settle locks its job rows
-- first, then the wait rows of every child it settled, in id order, once, at
-- the end of the statement; the parent's row it takes SKIP LOCKED (never
-- waiting: a parent locked right then is either handing itself back, and then
-- finds its wait gone and makes itself due, or locked by an operator call, and
-- then the wake falls to its backstop poll). No holder of a wait row ever
-- waits for a job row, so wait rows sit after every job row in the order.
--
-- Row triggers fire at the end of a statement in the order its rows were
-- written, so they cannot lock in id order themselves: a BEFORE trigger on each
-- settling child notes its wait in the transaction's `trio_jobs.settled`
-- setting (cleared at the end of the transaction), and the first AFTER trigger
-- of the statement takes every noted wait at once, sorted.
ALTER TABLE trio_jobs_jobs ADD COLUMN parent_id uuid;
ALTER TABLE trio_jobs_jobs ADD COLUMN parent_wait uuid;

CREATE INDEX trio_jobs_jobs_parent_idx
    ON trio_jobs_jobs (parent_id, created_at)
    WHERE parent_id IS NOT NULL;

CREATE TABLE trio_jobs_child_waits (
    id         uuid PRIMARY KEY,
    parent_id  uuid NOT NULL,
    pending    integer NOT NULL,
    waiting    boolean NOT NULL DEFAULT false,
    -- where the wake is announced: the parent's queue on the driver's channel
    channel    text NOT NULL,
    queue      text NOT NULL
);

-- BEFORE: a child leaving the live states notes its wait (and the time, for the
-- parent's run_at), once: its parent_wait goes, so a requeued child settling
-- again counts nothing twice.
CREATE FUNCTION trio_jobs_child_note() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r trio_jobs_jobs;
    at float8;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
        at := trio_jobs_now(NULL);
    ELSE
        r := NEW;
        at := NEW.updated_at;
    END IF;
    PERFORM set_config('trio_jobs.settled',
        concat_ws(',', nullif(current_setting('trio_jobs.settled', true), ''),
            current_schema() || '/' || r.parent_wait::text || '/' || at::text),
        true);
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.parent_wait := NULL;
    RETURN NEW;
END
$$;

-- AFTER: the first of the statement takes every wait noted in this schema, in
-- id order, counts it down and wakes the parents of the waits that reached
-- zero; the later ones find nothing noted.
CREATE FUNCTION trio_jobs_child_flush() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    mine text := current_schema() || '/';
    noted text := current_setting('trio_jobs.settled', true);
    keep text[] := '{}';
    waits uuid[] := '{}';
    ats float8[] := '{}';
    e text;
    parts text[];
    c record;
    w trio_jobs_child_waits;
    q text;
BEGIN
    IF noted IS NULL OR noted = '' THEN
        RETURN NULL;
    END IF;
    FOREACH e IN ARRAY string_to_array(noted, ',') LOOP
        IF starts_with(e, mine) THEN
            parts := string_to_array(substr(e, length(mine) + 1), '/');
            waits := waits || parts[1]::uuid;
            ats := ats || parts[2]::float8;
        ELSE
            keep := keep || e;
        END IF;
    END LOOP;
    PERFORM set_config('trio_jobs.settled', array_to_string(keep, ','), true);
    FOR c IN
        SELECT t.id, count(*)::int AS k, min(t.at) AS at
        FROM unnest(waits, ats) AS t(id, at)
        GROUP BY t.id
        ORDER BY t.id
    LOOP
        UPDATE trio_jobs_child_waits SET pending = pending - c.k
        WHERE id = c.id
        RETURNING * INTO w;
        IF FOUND AND w.pending <= 0 THEN
            DELETE FROM trio_jobs_child_waits WHERE id = c.id;
            IF w.waiting THEN
                UPDATE trio_jobs_jobs j SET run_at = least(j.run_at, c.at)
                WHERE j.id = (
                    SELECT p.id FROM trio_jobs_jobs p
                    WHERE p.id = w.parent_id AND p.state = 'suspended'
                    FOR NO KEY UPDATE SKIP LOCKED
                )
                RETURNING j.queue INTO q;
                IF FOUND THEN
                    PERFORM pg_notify(w.channel, q);
                END IF;
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER trio_jobs_jobs_child_note
    BEFORE UPDATE OF state ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.parent_wait IS NOT NULL
          AND OLD.state IN ('ready', 'delayed', 'running', 'suspended')
          AND NEW.state NOT IN ('ready', 'delayed', 'running', 'suspended'))
    EXECUTE FUNCTION trio_jobs_child_note();

CREATE TRIGGER trio_jobs_jobs_child_note_gone
    BEFORE DELETE ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.parent_wait IS NOT NULL
          AND OLD.state IN ('ready', 'delayed', 'running', 'suspended'))
    EXECUTE FUNCTION trio_jobs_child_note();

CREATE TRIGGER trio_jobs_jobs_child_flush
    AFTER UPDATE OF state ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.parent_wait IS NOT NULL AND NEW.parent_wait IS NULL)
    EXECUTE FUNCTION trio_jobs_child_flush();

CREATE TRIGGER trio_jobs_jobs_child_flush_gone
    AFTER DELETE ON trio_jobs_jobs
    FOR EACH ROW
    WHEN (OLD.parent_wait IS NOT NULL
          AND OLD.state IN ('ready', 'delayed', 'running', 'suspended'))
    EXECUTE FUNCTION trio_jobs_child_flush();

-- A batch of fresh inputs: a plain INSERT in an exception block (0032); NULL
-- when it met a held key or a known id (nothing written), else the queues it
-- inserted a due row into.
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
