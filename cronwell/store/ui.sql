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
