-- Counts for metrics and `cronwell status`: read-only counts over whole tables.

-- name: QueueDepthByPool
-- Due occurrences not yet started, per pool (the leading indicator of an SLA miss).
SELECT pool, count(*) AS n FROM cronwell_occurrences
WHERE state = 'pending' AND run_at <= now() GROUP BY pool;

-- name: JobsBehindCount
-- Live jobs whose next instant is past but not materialised (scheduler behind / unowned).
SELECT count(*) AS n FROM cronwell_jobs
WHERE NOT suspended AND deleted_at IS NULL AND next_run_at < now() - interval '5 seconds';

-- name: DeadCount
-- Dead-lettered occurrences (DLQ size).
SELECT count(*) AS n FROM cronwell_occurrences WHERE state = 'dead';

-- name: StatusBacklogCount
-- Change-log rows not yet written back (the operator's backlog gauge), with the database
-- clock so that the writer measures its lag against the clock that stamped the rows.
SELECT count(*) AS n, now() AS now FROM cronwell_status_changes;

-- name: OccurrenceCounts
-- Occurrences by state (status and tests).
SELECT state, count(*) AS n FROM cronwell_occurrences GROUP BY state ORDER BY state;
