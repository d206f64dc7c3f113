-- The process registry (cronwell_processes): schedulers and workers heartbeat here.

-- name: ProcessHeartbeat
-- Registers a process or refreshes its heartbeat.
INSERT INTO cronwell_processes AS p (id, role, pool, hostname, pid, version, concurrency, running)
VALUES (%(id)s, %(role)s, %(pool)s, %(hostname)s, %(pid)s, %(version)s, %(concurrency)s,
        %(running)s)
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), running = excluded.running, concurrency = excluded.concurrency;

-- name: ProcessDelete
-- Removes a process from the registry on clean shutdown.
DELETE FROM cronwell_processes WHERE id = %(id)s;

-- name: ProcessLiveCount
-- Live processes of a role (heartbeat within the TTL): schedulers balance partitions on it
-- (a worker counts its pool's with ProcessPoolView).
SELECT count(*) AS n FROM cronwell_processes
WHERE role = %(role)s AND heartbeat_at > now() - make_interval(secs => %(ttl)s);

-- name: ProcessPoolView
-- A worker's look at its pool (Worker._look): the live workers of the pool (heartbeat
-- within the TTL), and the most occurrences any of them has seen due at each coming
-- instant (the burst sizes shares are planned from: {epoch microseconds: count}). Writes
-- this worker's own view first when `bursts` is not NULL (it changed since the last
-- write); the read sees the views as they were before that write (one snapshot), the
-- worker merges its own.
WITH published AS (
    UPDATE cronwell_processes SET bursts = %(bursts)s::jsonb
    WHERE id = %(id)s AND %(bursts)s::jsonb IS NOT NULL),
live AS (
    SELECT bursts FROM cronwell_processes
    WHERE role = 'worker' AND pool = %(pool)s
      AND heartbeat_at > now() - make_interval(secs => %(ttl)s))
SELECT (SELECT count(*) FROM live) AS n,
       (SELECT jsonb_object_agg(e.key, e.n) FROM (
            SELECT b.key, max(b.value::bigint) AS n
            FROM live, jsonb_each_text(live.bursts) b GROUP BY b.key) e) AS bursts;

-- name: ProcessList
-- Live and recently seen processes for `cronwell status` / `cronwell workers`.
SELECT id, role, pool, hostname, pid, version, concurrency, running, started_at, heartbeat_at,
       heartbeat_at > now() - make_interval(secs => %(ttl)s) AS live
FROM cronwell_processes ORDER BY role, pool, id;

-- name: ProcessPrune
-- Forgets processes silent for much longer than the TTL.
DELETE FROM cronwell_processes WHERE heartbeat_at < now() - make_interval(secs => %(ttl)s * 10);
