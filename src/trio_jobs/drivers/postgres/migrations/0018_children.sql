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
