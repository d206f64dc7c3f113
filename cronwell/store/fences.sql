-- Fenced writes to users' resources (cronwell_fences).

-- name: FenceWrite
-- Fenced write check for a user's resource: succeeds only if `fence` is not below the
-- highest fence already accepted for it (rowcount 0 = stale writer).
INSERT INTO cronwell_fences AS f (resource, fence) VALUES (%(resource)s, %(fence)s)
ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, updated_at = now()
WHERE f.fence <= excluded.fence;

-- name: StoreIdentify
-- Records the cluster's system identifier; a store that finds itself on another cluster
-- (restored from a logical dump: the same rows, a new initdb) moves to the next fence
-- generation, so no fence issued on the old cluster is issued again (migration 0008).
-- Returns the generation in force.
UPDATE cronwell_store s
SET system_identifier = c.system_identifier,
    generation = s.generation + CASE WHEN s.system_identifier IS NULL THEN 0 ELSE 1 END
FROM pg_control_system() c
WHERE s.system_identifier IS DISTINCT FROM c.system_identifier
RETURNING s.generation;

-- name: StoreGenerationNext
-- Moves fences to the next generation (after restoring a physical backup whose timeline
-- the live cluster may already have used). Returns the new generation.
UPDATE cronwell_store SET generation = generation + 1 RETURNING generation;

-- name: FenceEpoch
-- What the next fence is made of: the store's generation, the timeline, the epoch base.
SELECT generation,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint AS timeline,
       cronwell_fence_base() AS base
FROM cronwell_store;

-- name: ReplicationDurability
-- Whether a commit waits for a synchronous standby: the server's settings and the
-- standbys it streams to (sync_state is visible to pg_monitor members; NULL otherwise).
SELECT current_setting('synchronous_standby_names') AS standby_names,
       current_setting('synchronous_commit') AS synchronous_commit,
       (SELECT count(*) FROM pg_stat_replication) AS standbys,
       (SELECT count(*) FROM pg_stat_replication
        WHERE sync_state IN ('sync', 'quorum')) AS sync_standbys;
