-- Read models of the web dashboard (`cronwell ui`): read-only, keyset-paginated. Every list
-- takes %(namespaces)s, the namespaces the viewer may see (NULL: all, the dashboard without
-- authentication), so a page is filtered before LIMIT, never after.

-- Filters shared by the three UiJobPage* queries (one per sort order, each keyset-paginated
-- on its own index, no OFFSET, so a page costs its size): namespace, pool, a substring of
-- namespace/name, labels (`@>`, GIN index cronwell_jobs_labels) and a state: suspended,
-- active (not suspended), failing (its last run died: consecutive_failures, partial index
-- cronwell_jobs_failing), late (not suspended and its next instant is past but not
-- materialised, or a materialised one is past its run_at and not started). Each row has the
-- states of its last 20 due occurrences (oldest first, one index range scan each), its last
-- finished result and when its last run finished (the counters' latest success/failure).

-- name: UiJobPageByName
-- One page of live jobs in (namespace, name) order after that cursor (index
-- cronwell_jobs_live_name).
SELECT j.namespace, j.name, j.pool, j.spec, j.labels, j.next_run_at, j.suspended,
       coalesce(r.recent, '{}') AS recent, last.state AS last_state,
       greatest(c.last_successful_at, c.last_failure_at) AS last_run_at
FROM cronwell_jobs j
LEFT JOIN cronwell_job_counters c ON c.job_id = j.id
LEFT JOIN LATERAL (
    SELECT array_agg(d.state ORDER BY d.scheduled_for) AS recent
    FROM (SELECT o.state, o.scheduled_for FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.scheduled_for <= now()
          ORDER BY o.scheduled_for DESC LIMIT 20) d
) r ON true
LEFT JOIN LATERAL (
    SELECT o.state FROM cronwell_occurrences o
    WHERE o.job_id = j.id AND o.finished_at IS NOT NULL
    ORDER BY o.scheduled_for DESC LIMIT 1
) last ON true
WHERE j.deleted_at IS NULL
  AND (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]))
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s)
  AND (%(text)s::text IS NULL OR strpos(j.namespace || '/' || j.name, %(text)s) > 0)
  AND (%(labels)s::jsonb IS NULL OR j.labels @> %(labels)s::jsonb)
  AND (%(state)s::text IS NULL
       OR (%(state)s = 'suspended' AND j.suspended)
       OR (%(state)s = 'active' AND NOT j.suspended)
       OR (%(state)s = 'failing' AND j.consecutive_failures <> 0)
       OR (%(state)s = 'late' AND NOT j.suspended
           AND (j.next_run_at < now()
                OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                           WHERE o.job_id = j.id AND o.scheduled_for < now()
                             AND o.state = 'pending' AND o.run_at < now()))))
  AND (%(after_ns)s::text IS NULL OR (j.namespace, j.name) > (%(after_ns)s, %(after_name)s))
ORDER BY j.namespace, j.name
LIMIT %(limit)s;

-- name: UiJobPageByNextRun
-- One page of live jobs soonest next run first (ended schedules last), after the
-- (next run, namespace, name) cursor (index cronwell_jobs_live_next, 0009).
SELECT j.namespace, j.name, j.pool, j.spec, j.labels, j.next_run_at, j.suspended,
       coalesce(r.recent, '{}') AS recent, last.state AS last_state,
       greatest(c.last_successful_at, c.last_failure_at) AS last_run_at
FROM cronwell_jobs j
LEFT JOIN cronwell_job_counters c ON c.job_id = j.id
LEFT JOIN LATERAL (
    SELECT array_agg(d.state ORDER BY d.scheduled_for) AS recent
    FROM (SELECT o.state, o.scheduled_for FROM cronwell_occurrences o
          WHERE o.job_id = j.id AND o.scheduled_for <= now()
          ORDER BY o.scheduled_for DESC LIMIT 20) d
) r ON true
LEFT JOIN LATERAL (
    SELECT o.state FROM cronwell_occurrences o
    WHERE o.job_id = j.id AND o.finished_at IS NOT NULL
    ORDER BY o.scheduled_for DESC LIMIT 1
) last ON true
WHERE j.deleted_at IS NULL
  AND (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]))
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s)
  AND (%(text)s::text IS NULL OR strpos(j.namespace || '/' || j.name, %(text)s) > 0)
  AND (%(labels)s::jsonb IS NULL OR j.labels @> %(labels)s::jsonb)
  AND (%(state)s::text IS NULL
       OR (%(state)s = 'suspended' AND j.suspended)
       OR (%(state)s = 'active' AND NOT j.suspended)
       OR (%(state)s = 'failing' AND j.consecutive_failures <> 0)
       OR (%(state)s = 'late' AND NOT j.suspended
           AND (j.next_run_at < now()
                OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                           WHERE o.job_id = j.id AND o.scheduled_for < now()
                             AND o.state = 'pending' AND o.run_at < now()))))
  AND (%(after_ns)s::text IS NULL
       OR (coalesce(j.next_run_at, 'infinity'::timestamptz), j.namespace, j.name)
          > (%(after_key)s::timestamptz, %(after_ns)s, %(after_name)s))
ORDER BY coalesce(j.next_run_at, 'infinity'::timestamptz), j.namespace, j.name
LIMIT %(limit)s;

-- name: UiJobPageByLastRun
-- One page of live jobs latest finished run first (never run last), after the (last run,
-- namespace, name) cursor, all three descending so the cursor is one row comparison. The
-- order spans two tables (jobs, counters): it is a keyset over a top-N sort of the filtered
-- live jobs, not an index order. The page is chosen first (subquery `p`, narrow rows: the
-- sort does not carry 100k specs) and only its rows read their spec and recent runs: with
-- the lateral reads beside the sort, every live job read its last 20 runs before the sort
-- kept 50 (100k index scans per page at 100k jobs).
SELECT p.namespace, p.name, pj.pool, pj.spec, pj.labels, pj.next_run_at, pj.suspended,
       coalesce(r.recent, '{}') AS recent, last.state AS last_state, p.last_run_at
FROM (
    SELECT j.id, j.namespace, j.name,
           greatest(c.last_successful_at, c.last_failure_at) AS last_run_at
    FROM cronwell_jobs j
    LEFT JOIN cronwell_job_counters c ON c.job_id = j.id
    WHERE j.deleted_at IS NULL
      AND (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]))
      AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
      AND (%(pool)s::text IS NULL OR j.pool = %(pool)s)
      AND (%(text)s::text IS NULL OR strpos(j.namespace || '/' || j.name, %(text)s) > 0)
      AND (%(labels)s::jsonb IS NULL OR j.labels @> %(labels)s::jsonb)
      AND (%(state)s::text IS NULL
           OR (%(state)s = 'suspended' AND j.suspended)
           OR (%(state)s = 'active' AND NOT j.suspended)
           OR (%(state)s = 'failing' AND j.consecutive_failures <> 0)
           OR (%(state)s = 'late' AND NOT j.suspended
               AND (j.next_run_at < now()
                    OR EXISTS (SELECT 1 FROM cronwell_occurrences o
                               WHERE o.job_id = j.id AND o.scheduled_for < now()
                                 AND o.state = 'pending' AND o.run_at < now()))))
      AND (%(after_ns)s::text IS NULL
           OR (coalesce(greatest(c.last_successful_at, c.last_failure_at),
                        '-infinity'::timestamptz), j.namespace, j.name)
              < (%(after_key)s::timestamptz, %(after_ns)s, %(after_name)s))
    ORDER BY coalesce(greatest(c.last_successful_at, c.last_failure_at),
                      '-infinity'::timestamptz) DESC, j.namespace DESC, j.name DESC
    LIMIT %(limit)s
) p
JOIN cronwell_jobs pj ON pj.id = p.id
LEFT JOIN LATERAL (
    SELECT array_agg(d.state ORDER BY d.scheduled_for) AS recent
    FROM (SELECT o.state, o.scheduled_for FROM cronwell_occurrences o
          WHERE o.job_id = p.id AND o.scheduled_for <= now()
          ORDER BY o.scheduled_for DESC LIMIT 20) d
) r ON true
LEFT JOIN LATERAL (
    SELECT o.state FROM cronwell_occurrences o
    WHERE o.job_id = p.id AND o.finished_at IS NOT NULL
    ORDER BY o.scheduled_for DESC LIMIT 1
) last ON true
ORDER BY coalesce(p.last_run_at, '-infinity'::timestamptz) DESC, p.namespace DESC,
         p.name DESC;

-- name: UiJobGet
-- The live job of a namespace/name for its page (uid for its runs, spec for its schedule).
SELECT id, namespace, name, pool, spec, next_run_at, suspended, suspended_reason
FROM cronwell_jobs
WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL;

-- name: UiRunPage
-- One page of occurrences, newest first, after the (scheduled_for, id) cursor, filtered by
-- namespace, job name, state, pool and a window of nominal instants [since, until); columns
-- as RunsList plus the id the cursor needs. The window bounds the column the page is
-- ordered by, so it narrows the same index range scan. A pool's runs are a range of
-- cronwell_occurrences_pool (0011); every pool's, each pool's page merged
-- (runs.newest_first: 0017 dropped the index of all runs newest first); a job's runs those
-- of its jobs by name, live or deleted (cronwell_jobs_name, 0010: the name index of live
-- jobs did not serve `j.name = X`, a scan of every job), each a range of
-- cronwell_occurrences_job; a rare state's a range of cronwell_occurrences_rare (0010).
SELECT o.id, j.namespace, j.name, j.spec->>'timeZone' AS time_zone, o.idempotency_key,
       o.scheduled_for, o.pool, o.state, o.attempt, o.fence, o.last_error,
       extract(epoch FROM o.run_at - o.scheduled_for) AS jitter_seconds,
       extract(epoch FROM o.started_at - o.run_at) AS lag_seconds,
       extract(epoch FROM o.finished_at - o.started_at) AS duration_seconds
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]))
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
  AND (%(state)s::text IS NULL OR o.state = %(state)s)
  AND (%(pool)s::text IS NULL OR o.pool = %(pool)s)
  AND (%(since)s::timestamptz IS NULL OR o.scheduled_for >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR o.scheduled_for < %(until)s::timestamptz)
  AND (%(after_at)s::timestamptz IS NULL
       OR (o.scheduled_for, o.id) < (%(after_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY o.scheduled_for DESC, o.id DESC
LIMIT %(limit)s;

-- name: UiJobLagHistogram
-- Start lags (started_at - scheduled_for, seconds) of one job's occurrences scheduled in
-- the last `window_seconds` (index cronwell_occurrences_job range scan): how many started,
-- p50 and p99 (percentile_cont), and the count per bucket of `edges` (width_bucket: bucket
-- 0 is below edges[1], bucket i is [edges[i], edges[i+1]), the last is >= the last edge).
WITH lags AS (
    SELECT extract(epoch FROM o.started_at - o.scheduled_for)::float8 AS lag
    FROM cronwell_occurrences o
    WHERE o.job_id = %(job_id)s
      AND o.scheduled_for >= now() - make_interval(secs => %(window_seconds)s)
      AND o.scheduled_for <= now()
      AND o.started_at IS NOT NULL
)
SELECT count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
       ARRAY(SELECT count(l.lag)
             FROM generate_series(0, cardinality(%(edges)s::float8[])) AS b
             LEFT JOIN lags l ON width_bucket(l.lag, %(edges)s::float8[]) = b
             GROUP BY b ORDER BY b) AS buckets
FROM lags;

-- name: UiDeadList
-- Dead-lettered occurrences, newest first, of the namespaces the viewer may see, optionally
-- of one namespace / job name; the columns of DeadList and the job's zone.
SELECT j.namespace, j.name, o.idempotency_key, o.scheduled_for, o.state, o.reason,
       o.last_error, o.attempt, o.max_attempts, o.fence, o.delivery, o.origin, o.started_at,
       o.finished_at, j.spec->>'timeZone' AS time_zone
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.state = 'dead'
  AND (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]))
  AND (%(namespace)s::text IS NULL OR j.namespace = %(namespace)s)
  AND (%(name)s::text IS NULL OR j.name = %(name)s)
ORDER BY o.finished_at DESC NULLS LAST, o.id DESC
LIMIT %(limit)s;

-- name: UiDeadNamespace
-- The namespace of a dead occurrence's job, among the namespaces the viewer may see (an action
-- is then authorised in that namespace; a key outside them is not found, not forbidden).
SELECT j.namespace
FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id
WHERE o.idempotency_key = %(key)s AND o.state = 'dead'
  AND (%(namespaces)b::text[] IS NULL OR j.namespace = ANY(%(namespaces)b::text[]));

-- name: UiNamespaces
-- Namespaces that have jobs, the candidates whose access the dashboard asks the API server
-- about: live jobs by a loose index scan of cronwell_jobs_live_name (one probe per namespace,
-- not a scan of every job), deleted ones (whose runs and dead letters remain) by the partial
-- index of deleted jobs.
WITH RECURSIVE live(namespace) AS (
    (SELECT namespace FROM cronwell_jobs WHERE deleted_at IS NULL ORDER BY namespace LIMIT 1)
    UNION ALL
    SELECT (SELECT j.namespace FROM cronwell_jobs j
            WHERE j.deleted_at IS NULL AND j.namespace > live.namespace
            ORDER BY j.namespace LIMIT 1)
    FROM live WHERE live.namespace IS NOT NULL
)
SELECT namespace FROM live WHERE namespace IS NOT NULL
UNION
SELECT namespace FROM cronwell_jobs WHERE deleted_at IS NOT NULL
ORDER BY namespace;

-- name: UiOccurrenceRows
-- The planner's row count of cronwell_occurrences (pg_class.reltuples, kept by
-- autovacuum/ANALYZE; NULL before the first one): whether /status counts every row or
-- estimates the final states (UiOccurrenceCounts).
SELECT nullif(reltuples, -1)::bigint AS n FROM pg_class
WHERE oid = 'cronwell_occurrences'::regclass;

-- name: UiOccurrenceCounts
-- Occurrences by state for /status on a large store, without reading every row: the states
-- work is waiting on or that need a person (pending, waiting, running, dead) counted
-- exactly, each through its partial index (cronwell_occurrences_claim, _active, _lease,
-- _dead), and the final states (succeeded, skipped, missed, cancelled) estimated from the
-- planner's statistics (row count x the state's frequency in pg_stats), `estimate` true.
SELECT state, n, false AS estimate FROM (
    SELECT 'pending' AS state, count(*) AS n FROM cronwell_occurrences WHERE state = 'pending'
    UNION ALL
    SELECT 'waiting', count(*) FROM cronwell_occurrences WHERE state = 'waiting'
    UNION ALL
    SELECT 'running', count(*) FROM cronwell_occurrences WHERE state = 'running'
    UNION ALL
    SELECT 'dead', count(*) FROM cronwell_occurrences WHERE state = 'dead'
) exact WHERE n > 0
UNION ALL
SELECT m.state, round(c.reltuples * m.freq)::bigint, true
FROM pg_class c, pg_stats s,
     unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(state, freq)
WHERE c.oid = 'cronwell_occurrences'::regclass
  AND s.schemaname = current_schema() AND s.tablename = 'cronwell_occurrences'
  AND s.attname = 'state'
  AND m.state NOT IN ('pending', 'waiting', 'running', 'dead')
  AND round(c.reltuples * m.freq) > 0
ORDER BY state;

-- name: UiBacklog
-- Per pool, occurrences due and not started (pending, run_at <= now: the workers' claim
-- order) counted up to `cap` + 1 (a bounded count: a stuck pool's backlog is not counted
-- row by row on every page view) and the oldest one's run_at. Pools by a loose index scan
-- of cronwell_occurrences_claim (one probe per pool), each count and oldest a range of it.
WITH RECURSIVE pools(pool) AS (
    (SELECT pool FROM cronwell_occurrences WHERE state = 'pending' ORDER BY pool LIMIT 1)
    UNION ALL
    SELECT (SELECT o.pool FROM cronwell_occurrences o
            WHERE o.state = 'pending' AND o.pool > pools.pool ORDER BY o.pool LIMIT 1)
    FROM pools WHERE pools.pool IS NOT NULL
)
SELECT p.pool, least(due.n, %(cap)s) AS due, due.n > %(cap)s AS more, oldest.run_at AS oldest_run_at,
       extract(epoch FROM now() - oldest.run_at) AS late_seconds
FROM pools p
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (SELECT 1 FROM cronwell_occurrences o
                               WHERE o.state = 'pending' AND o.pool = p.pool
                                 AND o.run_at <= now()
                               LIMIT %(cap)s + 1) b
) due
CROSS JOIN LATERAL (
    SELECT o.run_at FROM cronwell_occurrences o
    WHERE o.state = 'pending' AND o.pool = p.pool AND o.run_at <= now()
    ORDER BY o.run_at LIMIT 1
) oldest
WHERE p.pool IS NOT NULL
ORDER BY p.pool;

-- name: UiTableSizes
-- The store's tables (cronwell_*) with their size on disk, indexes and TOAST included
-- (pg_total_relation_size), and the planner's row estimate (NULL before the first ANALYZE):
-- catalogue reads, whatever the tables hold. A partitioned table (the history, issue 31)
-- is one row, the sums over its partitions (the parent itself holds nothing); its
-- partitions are not listed apart.
SELECT c.relname AS name, coalesce(t.bytes, pg_total_relation_size(c.oid)) AS bytes,
       coalesce(t.rows_estimate, nullif(c.reltuples, -1)::bigint) AS rows_estimate
FROM pg_class c
CROSS JOIN LATERAL (
    SELECT sum(pg_total_relation_size(p.relid))::bigint AS bytes,
           sum(nullif(r.reltuples, -1))::bigint AS rows_estimate
    FROM pg_partition_tree(c.oid) p JOIN pg_class r ON r.oid = p.relid
    WHERE p.isleaf AND c.relkind = 'p') t
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relnamespace = current_schema()::regnamespace
  AND starts_with(c.relname::text, 'cronwell_')
ORDER BY 2 DESC, c.relname;

-- name: UiOldestFinished
-- The oldest finished occurrence the store still keeps (what history limits and retention
-- have left): one probe of cronwell_occurrences_finished.
SELECT min(finished_at) FROM cronwell_occurrences WHERE finished_at IS NOT NULL;
