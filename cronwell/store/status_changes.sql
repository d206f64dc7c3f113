-- The status change log (cronwell_status_changes) and what a status shows: the operator's
-- status writer reads them.

-- name: StatusChangesRead
-- The oldest logged status changes (the operator's writer coalesces them per job), failures
-- first (dead letters and failed attempts: on the CR before a backlog of successes); jobs
-- in `skip` are backing off after failed writes, so their rows never block the others.
SELECT id, job_id, occurrence_id, scheduled_for, state, reason, attempt, error, changed_at
FROM cronwell_status_changes
WHERE NOT (job_id = ANY(%(skip)b::uuid[]))
ORDER BY coalesce(state = 'dead' OR (state = 'pending' AND attempt > 0), false) DESC, id
LIMIT %(limit)s;

-- name: StatusChangesReadFailures
-- The failures (as above) logged since a pass read `seen`: the writer puts them first.
SELECT id, job_id, occurrence_id, scheduled_for, state, reason, attempt, error, changed_at
FROM cronwell_status_changes
WHERE (state = 'dead' OR (state = 'pending' AND attempt > 0))
  AND NOT (job_id = ANY(%(skip)b::uuid[])) AND NOT (id = ANY(%(seen)b::bigint[]))
ORDER BY id LIMIT %(limit)s;

-- name: StatusChangesDelete
-- Forgets logged changes once the status they led to is written (or its CR is gone).
DELETE FROM cronwell_status_changes WHERE id = ANY(%(ids)b::bigint[]);

-- name: JobStatusBatch
-- Everything the status of each given job shows: totals from its counters row (history is
-- pruned, totals are not), the rest from the few newest occurrences of the job.
SELECT j.id, j.namespace, j.name, j.generation, j.suspended, j.suspended_reason,
       j.consecutive_failures, j.missed_total, j.deleted_at,
       CASE WHEN NOT j.suspended AND j.deleted_at IS NULL
            THEN least(j.next_run_at, nxt.t) END AS next_schedule_time,
       (j.next_run_at IS NULL AND nxt.t IS NULL) AS schedule_done,
       ls.t AS last_schedule_time,
       c.active, c.active_jobs, coalesce(t.succeeded_total, 0) AS succeeded,
       coalesce(t.dead_total, 0) AS dead, coalesce(t.skipped_total, 0) AS skipped,
       t.last_successful_at AS last_successful_time, coalesce(t.failed_total, 0) AS failed,
       t.last_failure_at AS last_failure_time, t.last_error,
       fin.state AS last_state, fin.reason AS last_reason, fin.idempotency_key AS last_key,
       fin.last_error AS last_state_error,
       extract(epoch FROM fin.finished_at - fin.started_at) AS last_duration_seconds
FROM cronwell_jobs j
LEFT JOIN cronwell_job_counters t ON t.job_id = j.id
-- Every lateral reads the job's own rows through (job_id, scheduled_for): its cost is the
-- job's retained history (bounded by its limits), never the size of the table or the
-- pool's backlog (ordering by finished_at walked the global finished_at index instead).
LEFT JOIN LATERAL (
    SELECT o.scheduled_for AS t FROM cronwell_occurrences o
    -- coalesce(): keeps the planner off the pool-wide claim index (a burst's backlog)
    WHERE o.job_id = j.id AND coalesce(o.state = 'pending' AND o.attempt = 0, false)
    ORDER BY o.scheduled_for LIMIT 1) nxt ON true
LEFT JOIN LATERAL (
    SELECT o.scheduled_for AS t FROM cronwell_occurrences o
    WHERE o.job_id = j.id AND o.started_at IS NOT NULL
    ORDER BY o.scheduled_for DESC LIMIT 1) ls ON true
-- Active occurrences, and the Jobs (job targets) the running ones' attempts recorded: the
-- newest 10 by nominal instant (status.active is bounded), from the same rows.
LEFT JOIN LATERAL (
    SELECT count(*) AS active,
           (array_agg(o.job_name ORDER BY o.scheduled_for DESC, o.id DESC)
                FILTER (WHERE o.state = 'running' AND o.job_fence = o.fence))[1:10]
               AS active_jobs
    FROM cronwell_occurrences o
    WHERE o.job_id = j.id
      AND (o.state = 'running' OR (o.state = 'pending' AND o.attempt > 0))) c ON true
-- The last result: the newest finished occurrence by nominal instant.
LEFT JOIN LATERAL (
    SELECT o.state, o.reason, o.idempotency_key, o.last_error, o.started_at, o.finished_at
    FROM cronwell_occurrences o WHERE o.job_id = j.id AND o.finished_at IS NOT NULL
    ORDER BY o.scheduled_for DESC, o.id DESC LIMIT 1) fin ON true
WHERE j.id = ANY(%(ids)b::uuid[]);

-- name: StatusWriterDeclare
-- Declares a status writer (or renews its declaration) until `ttl` seconds from now: the
-- triggers log status changes only while one is declared (migration 0014). Declarations
-- expired an hour ago (writers that died) are forgotten on the way.
WITH gone AS (
    DELETE FROM cronwell_status_writers
    WHERE expires_at < now() - interval '1 hour' AND identity <> %(identity)s)
INSERT INTO cronwell_status_writers AS w (identity, expires_at)
VALUES (%(identity)s, clock_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (identity) DO UPDATE SET expires_at = excluded.expires_at
RETURNING w.expires_at;

-- name: StatusWriterGapHolders
-- The transactions holding the no-writer lock (migration 0014) now, or those of `among`
-- still holding it: each found no writer declared and logged nothing. A writer declared
-- after a gap waits for them to end before it resyncs (not by taking the lock: that would
-- queue every write behind the slowest of them). 7367211650200 = 1715 << 32 | 1342737560.
SELECT coalesce(array_agg(l.virtualtransaction), '{}') AS holders
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 1715 AND l.objid = 1342737560
  AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (%(among)b::text[] IS NULL OR l.virtualtransaction = ANY(%(among)b::text[]));

-- name: StatusWriterRetire
-- A writer that stops cleanly withdraws its declaration: the log stops filling at once.
DELETE FROM cronwell_status_writers WHERE identity = %(identity)s;
