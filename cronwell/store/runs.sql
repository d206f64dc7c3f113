-- Occurrence history as `runs` and `dlq show` read it.

-- name: RunsList
-- Recent occurrences (optionally of one job, or one pool) with lag and attempts, newest
-- first. Lag is measured from run_at (the jittered instant); the jitter is its own column.
-- Without a job, state of cronwell_occurrences_rare or pool, runs.newest_first asks for
-- each pool's page (a range of cronwell_occurrences_pool) and merges them.
SELECT o.id, j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state,
       o.reason, o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.run_at - o.scheduled_for) AS jitter_seconds,
       extract(epoch FROM o.started_at - o.run_at) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
  AND (%(pool)s::text IS NULL OR o.pool = %(pool)s)
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: RunPools
-- The pools that have runs, by a loose index scan of cronwell_occurrences_pool (one probe
-- a pool): the listings of every pool's runs read each pool's newest.
WITH RECURSIVE pools(pool) AS (
    (SELECT pool FROM cronwell_occurrences ORDER BY pool LIMIT 1)
    UNION ALL
    SELECT (SELECT o.pool FROM cronwell_occurrences o
            WHERE o.pool > pools.pool ORDER BY o.pool LIMIT 1)
    FROM pools WHERE pools.pool IS NOT NULL
)
SELECT pool FROM pools WHERE pool IS NOT NULL;

-- name: RunsListForJob
-- Recent occurrences of one job by uid (the kubectl plugin resolves the CR to it), as
-- RunsList shows them.
SELECT o.id, j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.run_at, o.state,
       o.reason, o.origin, o.attempt, o.fence, o.started_at, o.finished_at, o.last_error,
       extract(epoch FROM o.run_at - o.scheduled_for) AS jitter_seconds,
       extract(epoch FROM o.started_at - o.run_at) AS lag_seconds,
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
