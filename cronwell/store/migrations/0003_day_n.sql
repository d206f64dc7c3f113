-- 0003: day N — the partition count in the store, job counters kept as totals in the job
-- row (history is pruned, totals must not shrink), and the instant a job was last resumed.

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
    ADD COLUMN succeeded_total    bigint NOT NULL DEFAULT 0,
    -- Failed attempts (failed, timeout, lease expired), retried or not.
    ADD COLUMN failed_total       bigint NOT NULL DEFAULT 0,
    -- Dead-letterings (a replayed occurrence that dies again counts again).
    ADD COLUMN dead_total         bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_total      bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_successful_at timestamptz,
    ADD COLUMN last_failure_at    timestamptz,
    ADD COLUMN last_error         text,
    -- When the job last went from suspended to running: instants before it that were never
    -- materialised fell in the suspension (missed, reason Suspended, at most one catch-up).
    ADD COLUMN resumed_at         timestamptz;

-- Totals of a store created before this migration, from the history it still has.
UPDATE cronwell_jobs j
SET succeeded_total = c.succeeded, dead_total = c.dead, skipped_total = c.skipped,
    last_successful_at = c.last_ok
FROM (SELECT job_id, count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
             count(*) FILTER (WHERE state = 'dead') AS dead,
             count(*) FILTER (WHERE state = 'skipped') AS skipped,
             max(finished_at) FILTER (WHERE state = 'succeeded') AS last_ok
      FROM cronwell_occurrences GROUP BY job_id) c
WHERE j.id = c.job_id;
UPDATE cronwell_jobs j
SET failed_total = f.failed, last_failure_at = f.last_at, last_error = f.last_error
FROM (SELECT o.job_id, count(*) AS failed, max(a.finished_at) AS last_at,
             (array_agg(a.error ORDER BY a.finished_at DESC))[1] AS last_error
      FROM cronwell_attempts a JOIN cronwell_occurrences o ON o.id = a.occurrence_id
      WHERE a.outcome IN ('failed', 'timeout', 'lease_expired') GROUP BY o.job_id) f
WHERE j.id = f.job_id;

-- Counters follow every state change, whichever path made it (worker completion,
-- ctx.transaction(), lease reaping, overlap settlement): one place for the fact. Jobs are
-- locked in id order first, so two statements finishing occurrences of the same jobs
-- never deadlock; NO KEY UPDATE does not conflict with the KEY SHARE that inserting an
-- occurrence takes on its job.
CREATE FUNCTION cronwell_job_counters_occurrence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM cronwell_jobs
    WHERE id IN (SELECT n.job_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                 WHERE n.state IS DISTINCT FROM o.state
                   AND n.state IN ('succeeded', 'dead', 'skipped'))
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE cronwell_jobs j
    SET succeeded_total = j.succeeded_total + c.succeeded, dead_total = j.dead_total + c.dead,
        skipped_total = j.skipped_total + c.skipped,
        last_successful_at = greatest(j.last_successful_at, c.last_ok)
    FROM (SELECT n.job_id, count(*) FILTER (WHERE n.state = 'succeeded') AS succeeded,
                 count(*) FILTER (WHERE n.state = 'dead') AS dead,
                 count(*) FILTER (WHERE n.state = 'skipped') AS skipped,
                 max(n.finished_at) FILTER (WHERE n.state = 'succeeded') AS last_ok
          FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE n.state IS DISTINCT FROM o.state AND n.state IN ('succeeded', 'dead', 'skipped')
          GROUP BY n.job_id) c
    WHERE j.id = c.job_id;
    RETURN NULL;
END $$;

CREATE FUNCTION cronwell_job_counters_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM cronwell_jobs
    WHERE id IN (SELECT o.job_id FROM new_rows a JOIN cronwell_occurrences o
                 ON o.id = a.occurrence_id
                 WHERE a.outcome IN ('failed', 'timeout', 'lease_expired'))
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE cronwell_jobs j
    SET failed_total = j.failed_total + f.failed,
        last_failure_at = greatest(j.last_failure_at, f.last_at),
        last_error = CASE WHEN j.last_failure_at IS NULL OR f.last_at >= j.last_failure_at
                          THEN f.last_error ELSE j.last_error END
    FROM (SELECT o.job_id, count(*) AS failed, max(a.finished_at) AS last_at,
                 (array_agg(left(a.error, 2000) ORDER BY a.finished_at DESC))[1] AS last_error
          FROM new_rows a JOIN cronwell_occurrences o ON o.id = a.occurrence_id
          WHERE a.outcome IN ('failed', 'timeout', 'lease_expired')
          GROUP BY o.job_id) f
    WHERE j.id = f.job_id;
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
