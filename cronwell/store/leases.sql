-- The schedulers' partition leases (cronwell_partitions): one holder per partition at a
-- time, with an epoch that a takeover increments (fencing).

-- name: PartitionRenew
-- Extends the leases this holder still owns at its epoch; missing rows were lost.
UPDATE cronwell_partitions
SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE holder = %(holder)s AND expires_at > now()
  AND (partition, epoch) IN (SELECT * FROM unnest(%(partitions)b::int[], %(epochs)b::bigint[]))
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
WHERE holder = %(holder)s AND partition = ANY(%(partitions)b::int[]);

-- name: PartitionList
-- Partition owners for `cronwell status`.
SELECT partition, holder, epoch, expires_at, expires_at > now() AS live
FROM cronwell_partitions ORDER BY partition;
