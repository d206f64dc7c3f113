-- Pruning: history limits and retention, in bounded batches (cronwell/maintenance.py).

-- name: HistoryLimitPrune
-- Per-job history limits for the jobs after `after` in uid order (`jobs` of them): deletes
-- at most `limit` finished occurrences beyond the newest successfulJobsHistoryLimit
-- succeeded ones and failedJobsHistoryLimit of each other final state (their attempts go
-- with them: the trigger cronwell_attempts_occurrence_delete, 0007). Returns the last job
-- examined (NULL: the sweep is over) and the rows deleted. `until`: only instants before
-- it are ranked, a constant (never NULL) so that the partitions created ahead stay out of
-- the plan, generic or custom; a finished row after it (settled ahead of its instant) is not counted, so
-- the sweep keeps more, never fewer, and a later one ranks it. Rows are deleted by
-- (id, instant): one partition probed each, not every partition.
WITH js AS (
    SELECT id, coalesce((spec ->> 'successfulJobsHistoryLimit')::int, 100) AS ok_keep,
           coalesce((spec ->> 'failedJobsHistoryLimit')::int, 100) AS bad_keep
    FROM cronwell_jobs WHERE id > %(after)s ORDER BY id LIMIT %(jobs)s),
ranked AS (
    SELECT o.id, o.scheduled_for,
           row_number() OVER (PARTITION BY o.job_id, o.state
                              ORDER BY o.scheduled_for DESC, o.id DESC) AS rn,
           CASE WHEN o.state = 'succeeded' THEN js.ok_keep ELSE js.bad_keep END AS keep
    FROM js JOIN cronwell_occurrences o ON o.job_id = js.id
    WHERE o.state IN ('succeeded', 'dead', 'skipped', 'missed', 'cancelled')
      AND o.scheduled_for < %(until)s),
gone AS (
    DELETE FROM cronwell_occurrences d
    USING (SELECT id, scheduled_for FROM ranked WHERE rn > keep LIMIT %(limit)s) x
    WHERE d.id = x.id AND d.scheduled_for = x.scheduled_for
      AND d.scheduled_for < %(until)s
    RETURNING 1)
SELECT (SELECT max(id::text)::uuid FROM js) AS last_job, (SELECT count(*) FROM gone) AS deleted;

-- name: HistoryRetentionPrune
-- Store-wide retention: at most `limit` finished occurrences of deleted and one-shot jobs
-- that finished longer than `retention` seconds ago, oldest first (their attempts go with
-- them: the trigger cronwell_attempts_occurrence_delete, 0007).
DELETE FROM cronwell_occurrences
WHERE id IN (SELECT o.id FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
             WHERE o.finished_at < now() - make_interval(secs => %(retention)s)
               AND (j.deleted_at IS NOT NULL OR j.spec ->> 'runAt' IS NOT NULL)
             ORDER BY o.finished_at LIMIT %(limit)s);

-- name: JobTombstonePurge
-- Forgets at most `limit` jobs deleted longer than `retention` seconds ago whose history
-- is gone (nothing references them any more), with their counters.
WITH gone AS (
    DELETE FROM cronwell_jobs
    WHERE id IN (SELECT j.id FROM cronwell_jobs j
                 WHERE j.deleted_at < now() - make_interval(secs => %(retention)s)
                   AND NOT EXISTS (SELECT 1 FROM cronwell_occurrences o WHERE o.job_id = j.id)
                 LIMIT %(limit)s)
    RETURNING id),
counters AS (DELETE FROM cronwell_job_counters c USING gone WHERE c.job_id = gone.id)
SELECT count(*) AS n FROM gone;

-- name: StatusChangesPrune
-- Change-log rows older than the retention (left undrained by an operator that died: the log
-- fills only while a writer is declared, migration 0014; a status is recomputed from the
-- store anyway).
DELETE FROM cronwell_status_changes
WHERE id IN (SELECT id FROM cronwell_status_changes
             WHERE changed_at < now() - make_interval(secs => %(retention)s)
             ORDER BY id LIMIT %(limit)s);

-- name: OutboxPublishedPrune
-- Outbox messages published longer than the retention ago.
DELETE FROM cronwell_outbox
WHERE id IN (SELECT id FROM cronwell_outbox
             WHERE published_at < now() - make_interval(secs => %(retention)s)
             ORDER BY id LIMIT %(limit)s);
