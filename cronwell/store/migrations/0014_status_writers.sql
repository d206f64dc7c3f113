-- 0014: status-change rows only while a status writer drains them (issue 30).
--
-- 0002's triggers logged every change, whether or not an operator would ever read the log
-- (standalone `cronwell run`, the bench, a store without an operator): two rows per
-- occurrence written on the hot path, then pruned unread. A status writer (the operator's
-- leader) now declares itself here and keeps its row fresh; the triggers log only while a
-- declaration is unexpired. A writer that dies stops the logging when its row expires (its
-- TTL, 30 s by default); one that stops cleanly deletes its row.
CREATE TABLE cronwell_status_writers (
    identity   text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

-- Whether the current statement's changes are logged; once per statement (the triggers are
-- statement-level). With a writer declared, one probe of this tiny table. Without one, the
-- answer "no" is taken under a shared advisory lock held to the end of the transaction and
-- checked again under it (a fresh snapshot: PL/pgSQL takes one per query): a writer that
-- declares itself after a gap takes the lock exclusively (StatusWriterDeclareAfterGap), so
-- it waits for every transaction that decided not to log, and its resync of every status
-- reads their changes. The lock is taken only when no writer is declared, never while one
-- is: an operator's store pays nothing for it.
CREATE FUNCTION cronwell_status_logging() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    -- now(): the transaction's start, never later than the statement; an expiry passed
    -- during a long transaction still logs (more, never less).
    IF EXISTS (SELECT 1 FROM cronwell_status_writers WHERE expires_at > now()) THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(7367211650200);
    RETURN EXISTS (SELECT 1 FROM cronwell_status_writers WHERE expires_at > now());
END $$;

-- The three trigger functions of 0002 (and 0006's update), each first asking whether to log.
CREATE OR REPLACE FUNCTION cronwell_status_occurrence_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT cronwell_status_logging() THEN
        RETURN NULL;
    END IF;
    -- New pending occurrences change nothing visible (the job's cursor row says when).
    INSERT INTO cronwell_status_changes (job_id, occurrence_id, scheduled_for, state, reason,
                                         attempt)
    SELECT n.job_id, n.id, n.scheduled_for, n.state, n.reason, n.attempt
    FROM new_rows n WHERE n.state <> 'pending'
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION cronwell_status_occurrence_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT cronwell_status_logging() THEN
        RETURN NULL;
    END IF;
    -- Heartbeats (lease extensions) change neither state, attempt nor Job: not logged.
    INSERT INTO cronwell_status_changes (job_id, occurrence_id, scheduled_for, state, reason,
                                         attempt, error)
    SELECT n.job_id, n.id, n.scheduled_for, n.state, n.reason, n.attempt,
           left(n.last_error, 500)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state OR n.attempt IS DISTINCT FROM o.attempt
       OR n.job_fence IS DISTINCT FROM o.job_fence
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION cronwell_status_job_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT cronwell_status_logging() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO cronwell_status_changes (job_id) SELECT n.id FROM new_rows n ORDER BY n.id;
    ELSE
        INSERT INTO cronwell_status_changes (job_id)
        SELECT n.id FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.next_run_at IS DISTINCT FROM o.next_run_at
           OR n.suspended IS DISTINCT FROM o.suspended
           OR n.suspended_reason IS DISTINCT FROM o.suspended_reason
           OR n.consecutive_failures IS DISTINCT FROM o.consecutive_failures
           OR n.missed_total IS DISTINCT FROM o.missed_total
           OR n.generation IS DISTINCT FROM o.generation
           OR n.deleted_at IS DISTINCT FROM o.deleted_at
        ORDER BY n.id;
    END IF;
    RETURN NULL;
END $$;
