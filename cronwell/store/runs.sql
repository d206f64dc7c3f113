-- Occurrence history as `runs` and `dlq show` read it.

-- name: RunsList
-- Recent occurrences (optionally of one job) with lag and attempts, newest first.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state, o.reason,
       o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.started_at - o.scheduled_for) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: RunsListForJob
-- Recent occurrences of one job by uid (the kubectl plugin resolves the CR to it), as
-- RunsList shows them.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state, o.reason,
       o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.started_at - o.scheduled_for) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.job_id = %(job_id)s
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: OccurrenceGet
-- One occurrence by idempotency key, with its job, for `cronwell dlq show`.
SELECT j.namespace, j.name, j.deleted_at AS job_deleted_at, o.idempotency_key, o.job_id,
       o.pool, o.scheduled_for, o.run_at, o.state, o.reason, o.last_error, o.origin,
       o.overlap, o.delivery, o.attempt, o.max_attempts, o.fence, o.worker_id,
       o.lease_expires_at, o.started_at, o.finished_at, o.created_at
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.idempotency_key = %(key)s;

-- name: AttemptList
-- Every recorded attempt of one key, in order (fences strictly increase along it).
SELECT attempt, fence, worker_id, outcome, error, started_at, finished_at
FROM cronwell_attempts WHERE idempotency_key = %(key)s ORDER BY id;
