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

-- name: JobDueClaim
-- Due jobs (next_run_at within the horizon) of one partition this holder owns right now at
-- this epoch, oldest first, locked so concurrent materialisers never process a job twice.
-- One partition per query keeps it an ordered index range scan that stops at the limit.
SELECT j.id, j.spec, j.spec_hash, j.pool, j.next_run_at, j.resumed_at, now() AS db_now
FROM cronwell_jobs j
WHERE j.partition = %(partition)s
  AND EXISTS (SELECT 1 FROM cronwell_partitions p
              WHERE p.partition = %(partition)s AND p.holder = %(holder)s
                AND p.epoch = %(epoch)s AND p.expires_at > now())
  AND NOT j.suspended AND j.deleted_at IS NULL AND j.next_run_at IS NOT NULL
  AND j.next_run_at <= now() + make_interval(secs => %(horizon)s)
ORDER BY j.next_run_at
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED;

-- name: OccurrenceInsertBatch
-- Materialises occurrences; the unique key makes any re-materialisation a no-op.
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, origin, overlap, delivery, max_attempts, timeout_seconds, finished_at)
SELECT k, j, p, s, r, st, rs, o, ov, d, ma, ts, CASE WHEN st = 'missed' THEN now() END
FROM unnest(%(keys)s::text[], %(job_ids)s::uuid[], %(pools)s::text[],
            %(scheduled_for)s::timestamptz[], %(run_at)s::timestamptz[], %(states)s::text[],
            %(reasons)s::text[], %(origins)s::text[], %(overlaps)s::text[],
            %(deliveries)s::text[], %(max_attempts)s::int[], %(timeouts)s::int[])
     AS t(k, j, p, s, r, st, rs, o, ov, d, ma, ts)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: JobAdvanceBatch
-- Moves each job's cursor past what was materialised and counts its missed instants.
UPDATE cronwell_jobs j
SET next_run_at = t.next_run_at, missed_total = j.missed_total + t.missed, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(next_run_at)s::timestamptz[], %(missed)s::int[])
     AS t(id, next_run_at, missed)
WHERE j.id = t.id;

-- name: JobNameLock
-- Serialises upserts of one namespace/name (two concurrent applies of a new name: the
-- second waits, then finds the first's row instead of violating the unique name).
SELECT pg_advisory_xact_lock(7367, hashtext(%(namespace)s || '/' || %(name)s));

-- name: JobGetLive
-- The live job of a namespace/name, locked for an upsert or delete.
SELECT id, spec, spec_hash, generation, suspended, next_run_at
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: JobGetById
-- A job by uid (live or tombstoned), locked for an upsert or delete.
SELECT id, namespace, name, spec, spec_hash, generation, suspended, next_run_at, deleted_at
FROM cronwell_jobs WHERE id = %(id)s FOR UPDATE;

-- name: JobInsert
-- A new job.
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, generation, pool, partition,
                           next_run_at, suspended)
VALUES (%(id)s, %(namespace)s, %(name)s, %(spec)s, %(spec_hash)s, %(generation)s, %(pool)s,
        %(partition)s, %(next_run_at)s, %(suspended)s);

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

-- name: OccurrenceTriggerInsert
-- A manual trigger: runs now, idempotent per trigger id (the key carries it).
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    origin, overlap, delivery, max_attempts, timeout_seconds)
VALUES (%(key)s, %(job_id)s, %(pool)s, now(), now(), 'pending', 'trigger', %(overlap)s,
        %(delivery)s, %(max_attempts)s, %(timeout_seconds)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: OccurrenceCounts
-- Occurrences by state (status and tests).
SELECT state, count(*) AS n FROM cronwell_occurrences GROUP BY state ORDER BY state;

-- ==== operator: status write-back, drift repair ====

-- name: JobLiveIdsList
-- Live jobs of some namespaces (all when NULL): drift repair compares them with the CRs.
SELECT id, namespace, name FROM cronwell_jobs
WHERE deleted_at IS NULL
  AND (%(namespaces)s::text[] IS NULL OR namespace = ANY(%(namespaces)s::text[]));

-- name: JobGenerationObserve
-- A CR generation whose spec means the same (same hash) is applied: record it as observed.
UPDATE cronwell_jobs SET generation = %(generation)s, updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL AND generation < %(generation)s;

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

-- ==== forecast ====

-- name: ForecastJobList
-- Live jobs of a pool (all when NULL) with the p90 duration of their last N successful runs:
-- those with a next instant, and one-shot (runAt) jobs whose only occurrence the scheduler
-- has materialised (next_run_at NULL) but is not due yet, so a burst still counts in the
-- horizon before it (the forecast enumerates instants from now: none is counted twice).
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
                  WHERE o.job_id = j.id AND o.state = 'pending' AND o.run_at > now()))
  AND (%(pool)s::text IS NULL OR j.pool = %(pool)s);

-- ==== day-2: backfill, pause/resume, kubectl plugin ====

-- name: BackfillExisting
-- The occurrences that already exist for some keys, with their state (backfill summary).
SELECT idempotency_key, state FROM cronwell_occurrences
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: BackfillInsert
-- Backfilled instants under their real keys; an instant that already has an occurrence
-- (run, running, pending, skipped, dead, missed) is left alone by the unique key.
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
    reason, origin, overlap, delivery, max_attempts, timeout_seconds)
SELECT k, %(job_id)s, %(pool)s, s, now(), 'pending', 'Backfill', 'backfill', %(overlap)s,
       %(delivery)s, %(max_attempts)s, %(timeout_seconds)s
FROM unnest(%(keys)s::text[], %(scheduled_for)s::timestamptz[]) AS t(k, s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: BackfillReopen
-- Missed instants of a backfilled window become runnable again, once (only `missed` rows
-- match, and they stop being missed here); origin and key are unchanged.
UPDATE cronwell_occurrences
SET state = 'pending', reason = 'Backfill', run_at = now(), finished_at = NULL,
    pool = %(pool)s, overlap = %(overlap)s, delivery = %(delivery)s,
    max_attempts = %(max_attempts)s, timeout_seconds = %(timeout_seconds)s
WHERE idempotency_key = ANY(%(keys)s::text[]) AND state = 'missed' AND job_id = %(job_id)s
RETURNING idempotency_key;

-- name: JobMissedUncount
-- Re-opened missed instants no longer count as missed for their job.
UPDATE cronwell_jobs SET missed_total = greatest(0, missed_total - %(n)s), updated_at = now()
WHERE id = %(id)s;

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

-- name: BackfillJobGet
-- The live job of a namespace/name with its suspension, locked while a backfill plans and
-- writes (its claims and materialisation wait; the window's rows are read consistently).
SELECT id, spec, pool, suspended, suspended_reason, next_run_at
FROM cronwell_jobs WHERE namespace = %(namespace)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- ==== webhook: admission rules, operator metrics ====

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
