-- The jobs (cronwell_jobs): one row per ScheduledJob, its spec, cursor (next_run_at) and
-- counters; tombstoned (deleted_at) rather than deleted so its history stays.

-- name: JobNameLock
-- Serialises upserts of one namespace/name (two concurrent applies of a new name: the
-- second waits, then finds the first's row instead of violating the unique name).
SELECT pg_advisory_xact_lock(7367, hashtext(%(namespace)s || '/' || %(name)s));

-- name: JobGetLive
-- The live job of a namespace/name, locked for an upsert or delete.
SELECT id, spec, spec_hash, generation, suspended, next_run_at, labels
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: JobGetById
-- A job by uid (live or tombstoned), locked for an upsert or delete.
SELECT id, namespace, name, spec, spec_hash, generation, suspended, next_run_at, deleted_at,
       labels
FROM cronwell_jobs WHERE id = %(id)s FOR UPDATE;

-- name: JobInsert
-- A new job.
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, generation, pool, partition,
                           next_run_at, suspended, labels)
VALUES (%(id)s, %(namespace)s, %(name)s, %(spec)s, %(spec_hash)s, %(generation)s, %(pool)s,
        %(partition)s, %(next_run_at)s, %(suspended)s, %(labels)s);

-- name: JobLabelsSet
-- A job's labels (its CR's metadata), written by an apply that found them changed on the
-- row it locked: labels are not part of the spec hash, so an apply whose spec is unchanged
-- still records a relabel.
UPDATE cronwell_jobs SET labels = %(labels)s WHERE id = %(id)s;

-- name: JobUpdate
-- A changed spec (next_run_at recomputed by the caller when the schedule changed).
UPDATE cronwell_jobs
SET spec = %(spec)s, spec_hash = %(spec_hash)s, generation = %(generation)s, pool = %(pool)s,
    next_run_at = %(next_run_at)s, suspended = %(suspended)s,
    suspended_reason = CASE WHEN %(suspended)s THEN suspended_reason END,
    resumed_at = CASE WHEN suspended AND NOT %(suspended)s THEN now() ELSE resumed_at END,
    updated_at = now()
WHERE id = %(id)s;

-- name: JobFutureOccurrencesDelete
-- Unstarted future occurrences of a job, removed when its schedule changes (no fence was
-- ever issued for them, so no effect can have happened). Returns the earliest removed.
WITH gone AS (
    DELETE FROM cronwell_occurrences
    WHERE job_id = %(id)s AND state = 'pending' AND attempt = 0 AND origin = 'schedule'
      AND scheduled_for > now()
    RETURNING scheduled_for)
SELECT min(scheduled_for) AS earliest, count(*) AS n FROM gone;

-- name: JobLatestScheduled
-- The latest nominal instant already materialised for a job (the cursor must not go back).
SELECT max(scheduled_for) AS latest FROM cronwell_occurrences
WHERE job_id = %(id)s AND origin IN ('schedule', 'catchup');

-- name: JobTombstone
-- Deletes a job: keeps its history, drops its unstarted occurrences.
WITH j AS (
    UPDATE cronwell_jobs SET deleted_at = now(), next_run_at = NULL, updated_at = now()
    WHERE id = %(id)s AND deleted_at IS NULL RETURNING id)
DELETE FROM cronwell_occurrences o USING j
WHERE o.job_id = j.id AND o.state IN ('pending', 'waiting') AND o.attempt = 0;

-- name: JobSuspendSet
-- Suspends or resumes a job; a resume records its instant (the instants before it that the
-- suspension skipped are missed, reason Suspended, with at most the misfire policy's
-- catch-up).
UPDATE cronwell_jobs SET suspended = %(suspended)s, suspended_reason = %(reason)s,
                         resumed_at = CASE WHEN suspended AND NOT %(suspended)s THEN now()
                                           ELSE resumed_at END,
                         updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL;

-- name: JobList
-- Live jobs with their counters for `cronwell jobs` / status.
SELECT id, namespace, name, pool, spec, next_run_at, suspended, suspended_reason,
       consecutive_failures, missed_total
FROM cronwell_jobs WHERE deleted_at IS NULL
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
ORDER BY namespace, name;

-- name: JobPauseBatch
-- `cronwell pause`: suspends the selected live jobs that are running their schedule (jobs
-- already suspended keep their own reason).
UPDATE cronwell_jobs SET suspended = true, suspended_reason = %(reason)s, updated_at = now()
WHERE deleted_at IS NULL AND NOT suspended
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
RETURNING namespace, name;

-- name: JobResumePausedBatch
-- `cronwell resume --all`: resumes the selected jobs suspended with this reason only (jobs
-- suspended by their spec, by hand or after failures stay suspended).
UPDATE cronwell_jobs SET suspended = false, suspended_reason = NULL, resumed_at = now(),
                         updated_at = now()
WHERE deleted_at IS NULL AND suspended AND suspended_reason = %(reason)s
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
RETURNING namespace, name;

-- name: OccurrenceTriggerLock
-- Serialises the triggers of one key (one trigger id sent twice at once), for the lookup in
-- OccurrenceTriggerInsert: a partitioned history has no unique index on the key alone (its
-- unique key is (key, instant), and a trigger's instant is now()). A statement of its own:
-- under READ COMMITTED the insert's snapshot must be taken after the lock is granted, to
-- see the row of the trigger that held it.
SELECT pg_advisory_xact_lock(7368, hashtext(%(key)s));

-- name: OccurrenceTriggerInsert
-- A manual trigger: runs now, idempotent per trigger id (the key carries it) for as long as
-- the history keeps its occurrence: inserted only if no occurrence has the key (looked up
-- in every partition: a trigger is rare), after OccurrenceTriggerLock in one transaction.
-- ON CONFLICT without a target: the same statement on both shapes (see "History
-- partitions" in docs/architecture.md).
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    origin, overlap, delivery, max_attempts, timeout_seconds)
SELECT %(key)s, %(job_id)s, %(pool)s, now(), now(), 'pending', 'trigger', %(overlap)s,
       %(delivery)s, %(max_attempts)s, %(timeout_seconds)s
WHERE NOT EXISTS (SELECT FROM cronwell_occurrences WHERE idempotency_key = %(key)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: JobLiveIdsList
-- Live jobs of some namespaces (all when NULL): drift repair compares them with the CRs.
SELECT id, namespace, name FROM cronwell_jobs
WHERE deleted_at IS NULL
  AND (%(namespaces)b::text[] IS NULL OR namespace = ANY(%(namespaces)b::text[]));

-- name: JobGenerationObserve
-- A CR generation whose spec means the same (same hash) is applied: record it as observed.
UPDATE cronwell_jobs SET generation = %(generation)s, updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL AND generation < %(generation)s;

-- name: WebhookNamespaceSchedules
-- The schedules a namespace's live jobs keep running, one row per distinct cron (NULL: the
-- one-shots) with how many jobs use it: the schedule-rate cap of the admission webhook.
-- The job under review (`name`) is left out; jobs suspended by their spec and finished jobs
-- (no next run, not suspended) produce nothing and are left out too.
SELECT spec->>'schedule' AS schedule, count(*) AS jobs
FROM cronwell_jobs
WHERE namespace = %(namespace)s AND name <> %(name)s AND deleted_at IS NULL
  AND NOT coalesce((spec->>'suspend')::boolean, false)
  AND (next_run_at IS NOT NULL OR suspended)
GROUP BY 1;

-- name: ForecastJobList
-- Live jobs of a pool (all when NULL) with the p90 duration of their last N successful runs:
-- those with a next instant, and one-shot (runAt) jobs whose only occurrence the scheduler
-- has materialised (next_run_at NULL) but is not due yet, or was claimed ahead of its instant
-- in the forecast's first second or later: a burst still counts in the horizon until its
-- instant is past (the forecast enumerates instants from now truncated to the second, and
-- counts due pending occurrences as backlog: none is counted twice). A burst that left the
-- forecast when workers claimed it ahead was never remembered by the scaler's hold, which
-- then scaled the pool down at the burst.
SELECT j.id, j.pool, j.spec, j.next_run_at, h.p90_seconds, h.runs
FROM cronwell_jobs j
CROSS JOIN LATERAL (
    SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY r.secs) AS p90_seconds, count(*) AS runs
    FROM (SELECT extract(epoch FROM o.finished_at - o.started_at)::float8 AS secs
          FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.state = 'succeeded'
            AND o.started_at IS NOT NULL AND o.finished_at IS NOT NULL
          ORDER BY o.scheduled_for DESC
          LIMIT %(history)s) r) h
WHERE NOT j.suspended AND j.deleted_at IS NULL
  AND (j.next_run_at IS NOT NULL
       OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                  WHERE o.job_id = j.id
                    AND (o.state = 'pending' AND o.run_at > now()
                         OR o.state IN ('running', 'waiting')
                            AND o.run_at >= date_trunc('second', now()))))
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s);

-- name: ForecastJobKeys
-- The jobs ForecastJobList returns, without their specs, as one row per pool of two arrays
-- (ids as text, spec hashes): the forecast keeps each job's demand by spec hash, fetches
-- only the specs it does not know (ForecastSpecs), and counts equal hashes at C speed.
-- An index-only scan of cronwell_jobs_forecast (0013); in id order, so that the same jobs
-- come as equal arrays (the forecast then reuses its counts).
SELECT j.pool, array_agg(j.id::text ORDER BY j.id) AS ids,
       array_agg(j.spec_hash ORDER BY j.id) AS hashes
FROM cronwell_jobs j
WHERE NOT j.suspended AND j.deleted_at IS NULL
  AND (j.next_run_at IS NOT NULL
       OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                  WHERE o.job_id = j.id
                    AND (o.state = 'pending' AND o.run_at > now()
                         OR o.state IN ('running', 'waiting')
                            AND o.run_at >= date_trunc('second', now()))))
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s)
GROUP BY j.pool;

-- name: ForecastSpecs
-- The spec document of each hash, read from the given jobs (one per unknown hash).
SELECT spec_hash, spec FROM cronwell_jobs WHERE id = ANY(%(ids)b::uuid[]);

-- name: ForecastDurations
-- The p90 duration of the last N successful runs of every live job (NULL p90: no history
-- left; ids as text): the forecast's full read.
SELECT j.id::text AS id, h.p90_seconds
FROM cronwell_jobs j
CROSS JOIN LATERAL (
    SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY r.secs) AS p90_seconds
    FROM (SELECT extract(epoch FROM o.finished_at - o.started_at)::float8 AS secs
          FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.state = 'succeeded'
            AND o.started_at IS NOT NULL AND o.finished_at IS NOT NULL
          ORDER BY o.scheduled_for DESC
          LIMIT %(history)s) r) h
WHERE j.deleted_at IS NULL;

-- name: ForecastDurationsSince
-- ForecastDurations of the live jobs that finished a run at or after `since` only, through
-- the finished_at index (a semi-join: the forecast keeps the others' from its previous read).
-- Its own query: `since IS NULL OR id IN (...)` in one scanned every job even to read none,
-- and one text for both reads (a UNION gated on `since IS NULL`) plans well per call but,
-- once psycopg prepares it, may go generic (the full read's cost makes the generic plan look
-- cheap): a scan of every job again, 1.3 s at 100k jobs. Apart, each keeps its own plan.
SELECT j.id::text AS id, h.p90_seconds
FROM cronwell_jobs j
CROSS JOIN LATERAL (
    SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY r.secs) AS p90_seconds
    FROM (SELECT extract(epoch FROM o.finished_at - o.started_at)::float8 AS secs
          FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.state = 'succeeded'
            AND o.started_at IS NOT NULL AND o.finished_at IS NOT NULL
          ORDER BY o.scheduled_for DESC
          LIMIT %(history)s) r) h
WHERE j.deleted_at IS NULL
  AND j.id IN (SELECT o.job_id FROM cronwell_occurrences o
               WHERE o.finished_at >= %(since)s AND o.state = 'succeeded');
