-- 0012: the pre-scaler's history (issue 29: the forecast view's "after the fact").
-- The operator's leader records each pre-scale it reports in a WorkerPool's
-- status.lastPreScale: when it scaled, the replicas and the burst it was for, and once
-- seen, when those pods were Ready and whether that was before the burst. The status keeps
-- only the latest; this keeps them for the dashboard until the store-wide retention prunes
-- them (cronwell/maintenance.py). One row per (WorkerPool, scaled_at), so a leader writing
-- the same pre-scale again, or a new leader reading it back from status, updates that row.
CREATE TABLE cronwell_prescales (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace text NOT NULL,
    workerpool text NOT NULL,
    pool text NOT NULL,
    scaled_at timestamptz NOT NULL,
    replicas integer NOT NULL CHECK (replicas >= 0),
    burst_at timestamptz,
    ready_at timestamptz,
    landed_before_burst boolean,
    UNIQUE (namespace, workerpool, scaled_at)
);

-- The dashboard's newest pre-scales of each pool (PreScaleRecent).
CREATE INDEX cronwell_prescales_pool ON cronwell_prescales (pool, scaled_at DESC);
-- The pruner's oldest first (PreScalePrune).
CREATE INDEX cronwell_prescales_scaled ON cronwell_prescales (scaled_at);
