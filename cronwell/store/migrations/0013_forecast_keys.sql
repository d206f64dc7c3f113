-- 0013: the forecast's live jobs (ForecastJobKeys) from an index, in a stable order.

-- ForecastJobKeys reads every live job's (pool, id, spec hash) on each forecast: the
-- operator's tick and each dashboard /forecast request. Without this index that was a
-- sequential scan of the jobs (their specs inline: 100 MB at 100k jobs) and a sort by pool
-- spilled to disk, 130-170 ms; an index-only scan of this one reads about a tenth of that,
-- already in (pool, id) order, so the ids come in the same order from one forecast to the
-- next and the Forecaster can tell that nothing changed by comparing them. Like every index
-- on the table it costs each job update one more entry (materialising sets next_run_at, not
-- a HOT update already: cronwell_jobs_due covers it).
CREATE INDEX cronwell_jobs_forecast ON cronwell_jobs (pool, id) INCLUDE (spec_hash, next_run_at)
    WHERE NOT suspended AND deleted_at IS NULL;
