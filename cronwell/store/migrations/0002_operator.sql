-- 0002: operator — a change log that feeds the status write-back of ScheduledJob CRs.

-- One row per change that can alter a job's status (an occurrence changed state or
-- attempt; the job's cursor, suspension, failures, generation or deletion changed).
-- Statement-level triggers append to it in the writer's transaction, so a change and its
-- log row commit together; append-only, so schedulers and workers never wait on a lock
-- here. The operator's status writer reads the oldest rows, coalesces them per job, patches
-- each CR's status once, then deletes the rows it handled (no id watermark: ids are
-- assigned before commit, so a watermark would skip rows committed out of order).
CREATE TABLE cronwell_status_changes (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        uuid        NOT NULL,
    occurrence_id bigint,      -- NULL: a change of the job row itself
    scheduled_for timestamptz,
    state         text,        -- the occurrence's new state
    reason        text,
    attempt       integer,
    error         text,        -- the attempt's error, truncated
    changed_at    timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION cronwell_status_occurrence_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- New pending occurrences change nothing visible (the job's cursor row says when).
    INSERT INTO cronwell_status_changes (job_id, occurrence_id, scheduled_for, state, reason,
                                         attempt)
    SELECT n.job_id, n.id, n.scheduled_for, n.state, n.reason, n.attempt
    FROM new_rows n WHERE n.state <> 'pending'
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE FUNCTION cronwell_status_occurrence_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Heartbeats (lease extensions) change neither state nor attempt: not logged.
    INSERT INTO cronwell_status_changes (job_id, occurrence_id, scheduled_for, state, reason,
                                         attempt, error)
    SELECT n.job_id, n.id, n.scheduled_for, n.state, n.reason, n.attempt,
           left(n.last_error, 500)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state OR n.attempt IS DISTINCT FROM o.attempt
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE FUNCTION cronwell_status_job_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
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

-- Transition tables need one trigger per event.
CREATE TRIGGER cronwell_status_occurrence_insert AFTER INSERT ON cronwell_occurrences
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_status_occurrence_inserted();
CREATE TRIGGER cronwell_status_occurrence_update AFTER UPDATE ON cronwell_occurrences
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_status_occurrence_updated();
CREATE TRIGGER cronwell_status_job_insert AFTER INSERT ON cronwell_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_status_job_changed();
CREATE TRIGGER cronwell_status_job_update AFTER UPDATE ON cronwell_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_status_job_changed();
