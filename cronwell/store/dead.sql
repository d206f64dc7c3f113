-- The dead-letter queue: occurrences in state dead.

-- name: DeadList
-- Dead-lettered occurrences (optionally of one job), newest first, with reason and error.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.state, o.reason,
       o.last_error, o.attempt, o.max_attempts, o.fence, o.delivery, o.origin, o.started_at,
       o.finished_at
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.state = 'dead'
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
ORDER BY o.finished_at DESC NULLS LAST, o.id DESC
LIMIT %(limit)s;

-- name: DeadReplay
-- Dead occurrences back to pending under the same key: attempt numbers continue, the budget
-- grows by the job's retry.maxAttempts, the claim issues a new, higher fence. Ambiguous
-- (AtMostOnce) ones only when asked; never for deleted jobs.
UPDATE cronwell_occurrences o
SET state = 'pending', reason = 'Replayed', run_at = now(), finished_at = NULL,
    lease_expires_at = NULL, worker_id = NULL,
    max_attempts = o.attempt + coalesce((j.spec -> 'retry' ->> 'maxAttempts')::int,
                                        o.max_attempts)
FROM cronwell_jobs j
WHERE j.id = o.job_id AND o.state = 'dead' AND j.deleted_at IS NULL
  AND (%(key)s::text IS NULL OR o.idempotency_key = %(key)s)
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(include_ambiguous)s OR o.reason IS DISTINCT FROM 'Ambiguous')
RETURNING o.idempotency_key, o.pool, o.run_at, o.attempt, o.max_attempts;

-- name: DeadPurge
-- Deletes dead occurrences finished longer ago than the cutoff (their attempts go with them:
-- the trigger cronwell_attempts_occurrence_delete, 0007).
DELETE FROM cronwell_occurrences o USING cronwell_jobs j
WHERE j.id = o.job_id AND o.state = 'dead'
  AND o.finished_at < now() - make_interval(secs => %(older_than)s)
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
RETURNING o.idempotency_key;

-- name: DeadMatchCount
-- How many dead occurrences match a filter (namespace, job name; NULL: any), and how many of
-- those DeadReplay would replay without include_ambiguous (not Ambiguous, job not deleted):
-- the counts a bulk replay or discard is confirmed against.
-- Dead letters by cronwell_occurrences_dead (0010); a job is read only to filter by it, and
-- deleted jobs are the few tombstones (cronwell_jobs_deleted): without a filter, a count
-- joined every dead letter to its job (a scan of every job at 100k jobs).
SELECT count(*) AS total,
       count(*) FILTER (WHERE o.reason IS DISTINCT FROM 'Ambiguous'
                        AND o.job_id NOT IN (SELECT d.id FROM cronwell_jobs d
                                             WHERE d.deleted_at IS NOT NULL)) AS replayable
FROM cronwell_occurrences o
WHERE o.state = 'dead'
  AND (%(namespace)s::text IS NULL AND %(name)s::text IS NULL
       OR o.job_id IN (SELECT j.id FROM cronwell_jobs j
                       WHERE (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
                         AND (%(name)s::text IS NULL OR j.name = %(name)s)));

-- name: DeadDiscard
-- Deletes dead occurrences (one key, or all matching namespace / job name) whatever their
-- age: what DeadPurge does without its cutoff (their attempts go with them: the trigger
-- cronwell_attempts_occurrence_delete, 0007). Only state dead: a replayed key is untouched.
DELETE FROM cronwell_occurrences o USING cronwell_jobs j
WHERE j.id = o.job_id AND o.state = 'dead'
  AND (%(key)s::text IS NULL OR o.idempotency_key = %(key)s)
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
RETURNING o.idempotency_key;
