-- Read models of the web dashboard (`cronwell ui`): read-only, keyset-paginated.

-- name: UiJobPage
-- One page of live jobs after the (namespace, name) cursor, filtered by namespace, pool and
-- a substring of namespace/name; keyset pagination (no OFFSET) so a page costs its size.
SELECT namespace, name, pool, spec, next_run_at, suspended
FROM cronwell_jobs
WHERE deleted_at IS NULL
  AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
  AND (%(pool)s::text IS NULL OR pool = %(pool)s)
  AND (%(text)s::text IS NULL OR strpos(namespace || '/' || name, %(text)s) > 0)
  AND (%(after_ns)s::text IS NULL OR (namespace, name) > (%(after_ns)s, %(after_name)s))
ORDER BY namespace, name
LIMIT %(limit)s;

-- name: UiJobGet
-- The live job of a namespace/name for its page (uid for its runs, spec for its schedule).
SELECT id, namespace, name, pool, spec, next_run_at, suspended, suspended_reason
FROM cronwell_jobs
WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL;

-- name: UiRunPage
-- One page of occurrences, newest first, after the (scheduled_for, id) cursor, filtered by
-- namespace, job name and state; columns as RunsList plus the id the cursor needs.
SELECT o.id, j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.state, o.attempt,
       o.fence, o.last_error,
       extract(epoch FROM o.started_at - o.run_at) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (o.scheduled_for, o.id) < (%(after_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;
