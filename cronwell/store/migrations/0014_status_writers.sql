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
-- declares itself after a gap takes the lock exclusively (StatusWriterGapLock), so
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

-- 0002's triggers (their functions unchanged) fire only while changes are logged: a WHEN
-- condition without column references, evaluated once per statement. Without a writer,
-- the trigger function is not even called.
DROP TRIGGER cronwell_status_occurrence_insert ON cronwell_occurrences;
CREATE TRIGGER cronwell_status_occurrence_insert AFTER INSERT ON cronwell_occurrences
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (cronwell_status_logging()) EXECUTE FUNCTION cronwell_status_occurrence_inserted();
DROP TRIGGER cronwell_status_occurrence_update ON cronwell_occurrences;
CREATE TRIGGER cronwell_status_occurrence_update AFTER UPDATE ON cronwell_occurrences
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (cronwell_status_logging()) EXECUTE FUNCTION cronwell_status_occurrence_updated();
DROP TRIGGER cronwell_status_job_insert ON cronwell_jobs;
CREATE TRIGGER cronwell_status_job_insert AFTER INSERT ON cronwell_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (cronwell_status_logging()) EXECUTE FUNCTION cronwell_status_job_changed();
DROP TRIGGER cronwell_status_job_update ON cronwell_jobs;
CREATE TRIGGER cronwell_status_job_update AFTER UPDATE ON cronwell_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    WHEN (cronwell_status_logging()) EXECUTE FUNCTION cronwell_status_job_changed();
