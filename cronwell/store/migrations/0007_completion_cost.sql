-- 0007: a cheaper completion (issue 18: the batch completion, OccurrenceSucceedBatch, was
-- 74 % of PostgreSQL's statement time in a 50k burst).

-- The attempts' foreign key to their occurrence cost one RI check per inserted attempt (a
-- per-row trigger running an index lookup + KEY SHARE lock, about 6 ms of a 400-row
-- batch) that can never fail: every attempt row is written by the statement that has just
-- updated its occurrence (attempts.sql: OccurrenceSucceedBatch, OccurrenceFail, LeaseReap),
-- from that update's RETURNING. Inserts are hot, deletes of occurrences are rare (history
-- limits, retention, dead-letter purge, schedule changes, job deletion), so the cascade
-- moves to the delete side: one statement-level trigger per DELETE, using the
-- cronwell_attempts_occurrence index (0001).
-- No orphan can appear without the foreign key's KEY SHARE lock: the statement that inserts
-- an attempt holds the occurrence's row lock (its UPDATE) until it commits. A concurrent
-- DELETE of that occurrence waits for the lock; once the completion commits, the delete
-- goes on (READ COMMITTED re-checks the updated row) and this trigger's DELETE, a new
-- statement with a new snapshot, sees the committed attempt and deletes it. A delete that
-- commits first leaves the completion's UPDATE nothing to update, so no attempt is
-- inserted. TRUNCATE fires no delete trigger: truncate cronwell_attempts with it.
ALTER TABLE cronwell_attempts DROP CONSTRAINT cronwell_attempts_occurrence_id_fkey;

-- The ids as one array, not a join with old_rows: plpgsql plans the statement once per
-- session and keeps the plan, and a join planned for a first large delete (a hash join over
-- a sequential scan of cronwell_attempts) would scan the whole table again for every later
-- delete of one occurrence; `= ANY (ARRAY(...))` is an index scan whatever the size.
CREATE FUNCTION cronwell_attempts_occurrence_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM cronwell_attempts WHERE occurrence_id = ANY (ARRAY(SELECT id FROM old_rows));
    RETURN NULL;
END $$;

CREATE TRIGGER cronwell_attempts_occurrence_delete AFTER DELETE ON cronwell_occurrences
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_attempts_occurrence_deleted();

-- Jobs with failures to reset. A success resets its job's consecutive_failures; looking up
-- each job of a batch by primary key (400 lookups to find, almost always, none) was
-- another 2-4 ms per batch. Few jobs are failing at any moment, so this index is small and
-- OccurrenceSucceedBatch finds the failing jobs of a batch in one scan of it. The price: an
-- update that changes consecutive_failures (a death, a reset) is no longer a HOT update;
-- those are rare next to completions.
CREATE INDEX cronwell_jobs_failing ON cronwell_jobs (id) WHERE consecutive_failures <> 0;
