-- 0003: day N — the partition count in the store, job counters kept as totals (history is
-- pruned, totals must not shrink), and the instant a job was last resumed.

-- One row: the partition count P. Every process reads it from here; `cronwell partitions
-- set N` changes it online (it re-partitions the jobs in the same transaction).
CREATE TABLE cronwell_config (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    partitions  integer     NOT NULL CHECK (partitions BETWEEN 1 AND 4096),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- A store created before this migration keeps the P its partition rows were made for; a
-- new store gets its P from `migrate` (the configured value, else the default).
INSERT INTO cronwell_config (partitions)
SELECT count(*) FROM cronwell_partitions HAVING count(*) > 0;

ALTER TABLE cronwell_jobs
    -- When the job last went from suspended to running: instants before it that were never
    -- materialised fell in the suspension (missed, reason Suspended, at most one catch-up).
    ADD COLUMN resumed_at timestamptz;

-- Status totals per job, kept as totals (history is pruned, totals must not shrink). A
-- table of its own, not columns of cronwell_jobs: a completion then never locks the job
-- row, which claims (JobLockBatch), the materialiser (JobDueClaim) and overlap decisions
-- lock, and never rewrites the job's spec row. No foreign key, so that no KEY SHARE lock
-- is taken on the job either; JobTombstonePurge deletes a job's row with the job.
CREATE TABLE cronwell_job_counters (
    job_id             uuid        PRIMARY KEY,
    succeeded_total    bigint      NOT NULL DEFAULT 0,
    -- Failed attempts (failed, timeout, lease expired), retried or not.
    failed_total       bigint      NOT NULL DEFAULT 0,
    -- Dead-letterings (a replayed occurrence that dies again counts again).
    dead_total         bigint      NOT NULL DEFAULT 0,
    skipped_total      bigint      NOT NULL DEFAULT 0,
    last_successful_at timestamptz,
    last_failure_at    timestamptz,
    last_error         text
);

-- Totals of a store created before this migration, from the history it still has.
INSERT INTO cronwell_job_counters (job_id, succeeded_total, dead_total, skipped_total,
                                   last_successful_at)
SELECT job_id, count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state = 'dead'), count(*) FILTER (WHERE state = 'skipped'),
       max(finished_at) FILTER (WHERE state = 'succeeded')
FROM cronwell_occurrences GROUP BY job_id;
INSERT INTO cronwell_job_counters AS c (job_id, failed_total, last_failure_at, last_error)
SELECT o.job_id, count(*), max(a.finished_at),
       (array_agg(a.error ORDER BY a.finished_at DESC))[1]
FROM cronwell_attempts a JOIN cronwell_occurrences o ON o.id = a.occurrence_id
WHERE a.outcome IN ('failed', 'timeout', 'lease_expired') GROUP BY o.job_id
ON CONFLICT (job_id) DO UPDATE
SET failed_total = excluded.failed_total, last_failure_at = excluded.last_failure_at,
    last_error = excluded.last_error;

-- Counters follow every state change, whichever path made it (worker completion,
-- ctx.transaction(), lease reaping, overlap settlement): one place for the fact. Upserts
-- in job_id order, so two statements counting for the same jobs never deadlock.
CREATE FUNCTION cronwell_job_counters_occurrence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cronwell_job_counters AS c (job_id, succeeded_total, dead_total,
                                            skipped_total, last_successful_at)
    SELECT n.job_id, count(*) FILTER (WHERE n.state = 'succeeded'),
           count(*) FILTER (WHERE n.state = 'dead'), count(*) FILTER (WHERE n.state = 'skipped'),
           max(n.finished_at) FILTER (WHERE n.state = 'succeeded')
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state AND n.state IN ('succeeded', 'dead', 'skipped')
    GROUP BY n.job_id ORDER BY n.job_id
    ON CONFLICT (job_id) DO UPDATE
    SET succeeded_total = c.succeeded_total + excluded.succeeded_total,
        dead_total = c.dead_total + excluded.dead_total,
        skipped_total = c.skipped_total + excluded.skipped_total,
        last_successful_at = greatest(c.last_successful_at, excluded.last_successful_at);
    RETURN NULL;
END $$;

CREATE FUNCTION cronwell_job_counters_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cronwell_job_counters AS c (job_id, failed_total, last_failure_at, last_error)
    SELECT o.job_id, count(*), max(a.finished_at),
           (array_agg(left(a.error, 2000) ORDER BY a.finished_at DESC))[1]
    FROM new_rows a JOIN cronwell_occurrences o ON o.id = a.occurrence_id
    WHERE a.outcome IN ('failed', 'timeout', 'lease_expired')
    GROUP BY o.job_id ORDER BY o.job_id
    ON CONFLICT (job_id) DO UPDATE
    SET failed_total = c.failed_total + excluded.failed_total,
        last_failure_at = greatest(c.last_failure_at, excluded.last_failure_at),
        last_error = CASE WHEN c.last_failure_at IS NULL
                            OR excluded.last_failure_at >= c.last_failure_at
                          THEN excluded.last_error ELSE c.last_error END;
    RETURN NULL;
END $$;

CREATE TRIGGER cronwell_job_counters_occurrence AFTER UPDATE ON cronwell_occurrences
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_job_counters_occurrence();
CREATE TRIGGER cronwell_job_counters_attempt AFTER INSERT ON cronwell_attempts
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cronwell_job_counters_attempt();

-- Retention finds finished occurrences of deleted jobs by job; tombstones by age.
CREATE INDEX cronwell_jobs_deleted ON cronwell_jobs (deleted_at) WHERE deleted_at IS NOT NULL;
