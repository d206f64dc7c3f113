-- All runtime SQL of cronwell. Each query: `-- name: NounVerb` then a one-line comment.
-- Every time comparison uses the database clock, now() (invariant 6).

-- name: MigrationLock
-- Serialises concurrent `migrate` runs (replicas starting together).
SELECT pg_advisory_xact_lock(7367211650142);

-- name: MigrationTableCreate
-- Bookkeeping of applied migrations.
CREATE TABLE IF NOT EXISTS cronwell_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: MigrationList
-- Versions already applied.
SELECT version FROM cronwell_migrations ORDER BY version;

-- name: MigrationRecord
-- Marks one migration applied.
INSERT INTO cronwell_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: SchemaPresent
-- Whether a cronwell schema exists at all (read-only: checking never creates it).
SELECT to_regclass('cronwell_migrations') IS NOT NULL AS present;

-- name: PartitionEnsure
-- Creates the partition lease rows 0..P-1 (idempotent).
INSERT INTO cronwell_partitions (partition)
SELECT generate_series(0, %(partitions)s - 1)
ON CONFLICT (partition) DO NOTHING;

-- name: PartitionTrim
-- Drops the lease rows of partitions beyond a reduced P (their owners see the loss).
DELETE FROM cronwell_partitions WHERE partition >= %(partitions)s;

-- name: ConfigPartitionsInit
-- The partition count of a new store (a store that has one keeps it).
INSERT INTO cronwell_config (partitions) VALUES (%(partitions)s) ON CONFLICT (id) DO NOTHING;

-- name: ConfigPartitionsGet
-- The partition count P every process uses.
SELECT partitions FROM cronwell_config;

-- name: ConfigPartitionsShare
-- P, read-locked for a job insert: a concurrent re-partition waits, then sees the job.
SELECT partitions FROM cronwell_config FOR SHARE;

-- name: ConfigPartitionsLock
-- P, locked for a re-partition (inserts of new jobs wait until it commits).
SELECT partitions FROM cronwell_config FOR UPDATE;

-- name: ConfigPartitionsSet
-- A new partition count (in the re-partition's transaction).
UPDATE cronwell_config SET partitions = %(partitions)s, updated_at = now();

-- name: JobPartitionList
-- Every job's uid and partition, in uid order from `after` (re-partitioning, a page at a time).
SELECT id, partition FROM cronwell_jobs WHERE id > %(after)s ORDER BY id LIMIT %(limit)s;

-- name: JobPartitionSetBatch
-- Moves jobs to their partition under the new P (row locks: a materialiser holding one of
-- these jobs finishes first; the unique key makes any overlap a no-op anyway).
UPDATE cronwell_jobs j SET partition = t.p
FROM unnest(%(ids)s::uuid[], %(partitions)s::int[]) AS t(id, p)
WHERE j.id = t.id AND j.partition <> t.p;

-- name: PartitionRenew
-- Extends the leases this holder still owns at its epoch; missing rows were lost.
UPDATE cronwell_partitions
SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE holder = %(holder)s AND expires_at > now()
  AND (partition, epoch) IN (SELECT * FROM unnest(%(partitions)s::int[], %(epochs)s::bigint[]))
RETURNING partition, epoch;

-- name: PartitionAcquire
-- Takes up to `want` free or expired partitions; a takeover increments the epoch.
UPDATE cronwell_partitions p
SET holder = %(holder)s, epoch = p.epoch + 1,
    expires_at = now() + make_interval(secs => %(ttl)s)
FROM (SELECT partition FROM cronwell_partitions
      WHERE holder IS NULL OR expires_at <= now()
      ORDER BY partition LIMIT %(want)s FOR UPDATE SKIP LOCKED) free
WHERE p.partition = free.partition
RETURNING p.partition, p.epoch;

-- name: PartitionRelease
-- Resigns partitions (rebalancing or shutdown) so others need not wait out the lease.
UPDATE cronwell_partitions SET holder = NULL, expires_at = NULL
WHERE holder = %(holder)s AND partition = ANY(%(partitions)s::int[]);

-- name: PartitionList
-- Partition owners for `cronwell status`.
SELECT partition, holder, epoch, expires_at, expires_at > now() AS live
FROM cronwell_partitions ORDER BY partition;

-- name: OccurrenceCounts
-- Occurrences by state (status and tests).
SELECT state, count(*) AS n FROM cronwell_occurrences GROUP BY state ORDER BY state;

-- ==== observability ====

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

-- ==== webhook: admission rules, operator metrics ====

-- name: StatusBacklogCount
-- Change-log rows not yet written back (the operator's backlog gauge), with the database
-- clock so that the writer measures its lag against the clock that stamped the rows.
SELECT count(*) AS n, now() AS now FROM cronwell_status_changes;

-- ==== tenancy: namespace and pool policies, encrypted Secret-backed headers ====

-- name: NamespacePolicyUpsert
-- The operator records a Namespace's labels and egress annotations (workers read them).
INSERT INTO cronwell_namespace_policies AS p (namespace, labels, egress_allow, egress_deny)
VALUES (%(namespace)s, %(labels)s, %(egress_allow)s, %(egress_deny)s)
ON CONFLICT (namespace) DO UPDATE
SET labels = excluded.labels, egress_allow = excluded.egress_allow,
    egress_deny = excluded.egress_deny, updated_at = now()
WHERE (p.labels, p.egress_allow, p.egress_deny)
      IS DISTINCT FROM (excluded.labels, excluded.egress_allow, excluded.egress_deny);

-- name: NamespacePolicyDelete
-- A Namespace is gone.
DELETE FROM cronwell_namespace_policies WHERE namespace = %(namespace)s;

-- name: NamespacePolicyList
-- Every namespace's labels and egress annotations (a worker caches them for a few seconds).
SELECT namespace, labels, egress_allow, egress_deny FROM cronwell_namespace_policies;

-- name: PoolPolicyUpsert
-- The operator records a WorkerPool's namespaces, namespace selector and handlers.
INSERT INTO cronwell_pool_policies AS p (pool, owner_namespace, namespaces,
                                         namespace_selector, handlers)
VALUES (%(pool)s, %(owner_namespace)s, %(namespaces)s, %(namespace_selector)s, %(handlers)s)
ON CONFLICT (pool, owner_namespace) DO UPDATE
SET namespaces = excluded.namespaces, namespace_selector = excluded.namespace_selector,
    handlers = excluded.handlers, updated_at = now();

-- name: PoolPolicyDelete
-- A WorkerPool is gone.
DELETE FROM cronwell_pool_policies WHERE pool = %(pool)s AND owner_namespace = %(owner_namespace)s;

-- name: PoolPolicyList
-- The policies of one pool (one row per WorkerPool of that name).
SELECT pool, owner_namespace, namespaces, namespace_selector, handlers
FROM cronwell_pool_policies WHERE pool = %(pool)s;

-- name: JobSecretUpsert
-- Stores a job's encrypted header values when they changed (digest), so rotation lands.
INSERT INTO cronwell_job_secrets AS s (job_id, ciphertext, digest)
VALUES (%(job_id)s, %(ciphertext)s, %(digest)s)
ON CONFLICT (job_id) DO UPDATE
SET ciphertext = excluded.ciphertext, digest = excluded.digest, resolved_at = now()
WHERE s.digest <> excluded.digest
RETURNING job_id;

-- name: JobSecretGet
-- A job's encrypted header values, read by the worker for each attempt (rotation reaches
-- the next attempt).
SELECT ciphertext FROM cronwell_job_secrets WHERE job_id = %(job_id)s;

-- name: JobSecretDelete
-- A job no longer has Secret-backed headers.
DELETE FROM cronwell_job_secrets WHERE job_id = %(job_id)s;

-- name: JobSecretRefList
-- Live jobs whose spec has Secret-backed headers (the operator re-resolves them on a period).
SELECT id, namespace, name, spec FROM cronwell_jobs
WHERE deleted_at IS NULL AND jsonb_path_exists(spec, '$.target.http.headers[*].valueFrom');

-- name: PoolPolicyListAll
-- Every WorkerPool's policy row (the operator's sync deletes those of vanished WorkerPools).
SELECT pool, owner_namespace FROM cronwell_pool_policies;
