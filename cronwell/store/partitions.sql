-- The partition count P (cronwell_config), each job's partition (cronwell_jobs.partition) and
-- the lease rows 0..P-1 that exist for it (cronwell_partitions; who holds them: leases.sql).

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
FROM unnest(%(ids)b::uuid[], %(partitions)b::int[]) AS t(id, p)
WHERE j.id = t.id AND j.partition <> t.p;

-- name: PartitionEnsure
-- Creates the partition lease rows 0..P-1 (idempotent).
INSERT INTO cronwell_partitions (partition)
SELECT generate_series(0, %(partitions)s - 1)
ON CONFLICT (partition) DO NOTHING;

-- name: PartitionTrim
-- Drops the lease rows of partitions beyond a reduced P (their owners see the loss).
DELETE FROM cronwell_partitions WHERE partition >= %(partitions)s;
