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
-- checked again under it (a fresh snapshot: PL/pgSQL takes one per query). A writer that
-- declares itself after a gap then waits for the transactions holding that lock
-- (StatusWriterGapHolders): every transaction that decided not to log has ended before its
-- resync reads the store, and any later check (made after the declaration committed) logs.
-- Nobody takes the lock exclusively, so it never makes a write wait; it is taken only when
-- no writer is declared: an operator's store pays nothing for it.
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
