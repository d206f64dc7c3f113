-- 0006: job target. The Kubernetes Job an attempt of a `job` target runs, recorded by the
-- worker once the Job is created or adopted, so that the operator can list running Jobs in
-- a ScheduledJob's status.active (as a CronJob does) without calling Kubernetes. The Job's
-- name is not a function of the occurrence alone (a retry after a failed Job runs the next
-- one, docs/design/job-target.md), hence a column. job_fence is the fence of the attempt
-- that recorded it: a name recorded by an earlier attempt is not the running Job's.
ALTER TABLE cronwell_occurrences ADD COLUMN job_name text;
ALTER TABLE cronwell_occurrences ADD COLUMN job_fence bigint;

-- The status log also records a recorded Job name (0002 logged state and attempt changes
-- only): status.active changes when the worker names the running Job.
CREATE OR REPLACE FUNCTION cronwell_status_occurrence_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
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
