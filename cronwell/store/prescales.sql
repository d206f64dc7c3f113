-- The pre-scaler's history (cronwell_prescales, migration 0012): written by the operator's
-- leader with each new or updated status.lastPreScale, read by the dashboard's forecast,
-- pruned with the store-wide retention.

-- name: PreScaleRecord
-- Records a pre-scale, or what became known of it since (Ready, landed): one row per
-- WorkerPool and instant, so repeated writes of the same pre-scale update it; a fact once
-- known is never forgotten by a later write that does not know it (a new leader).
INSERT INTO cronwell_prescales AS p (namespace, workerpool, pool, scaled_at, replicas,
                                     burst_at, ready_at, landed_before_burst)
VALUES (%(namespace)s, %(workerpool)s, %(pool)s, %(scaled_at)s, %(replicas)s,
        %(burst_at)s, %(ready_at)s, %(landed_before_burst)s)
ON CONFLICT (namespace, workerpool, scaled_at) DO UPDATE
SET pool = EXCLUDED.pool, replicas = EXCLUDED.replicas,
    burst_at = coalesce(EXCLUDED.burst_at, p.burst_at),
    ready_at = coalesce(EXCLUDED.ready_at, p.ready_at),
    landed_before_burst = coalesce(EXCLUDED.landed_before_burst, p.landed_before_burst);

-- name: PreScaleRecent
-- The newest `per_pool` pre-scales of each pool (or of `pool`) made in the last
-- `within` seconds, by pool then newest first; the lead achieved is burst - Ready.
SELECT namespace, workerpool, pool, scaled_at, replicas, burst_at, ready_at,
       landed_before_burst,
       extract(epoch FROM burst_at - ready_at)::float8 AS lead_seconds
FROM (SELECT *, row_number() OVER (PARTITION BY pool ORDER BY scaled_at DESC, id DESC) AS n
      FROM cronwell_prescales
      WHERE scaled_at > now() - make_interval(secs => %(within)s)
        AND (%(pool)s::text IS NULL OR pool = %(pool)s)) recent
WHERE n <= %(per_pool)s
ORDER BY pool, scaled_at DESC, id DESC;

-- name: PreScalePrune
-- Pre-scales made longer than the retention ago, at most `limit`, oldest first.
DELETE FROM cronwell_prescales
WHERE id IN (SELECT id FROM cronwell_prescales
             WHERE scaled_at < now() - make_interval(secs => %(retention)s)
             ORDER BY scaled_at LIMIT %(limit)s);
