-- 0009: the dashboard's jobs view filters by label and sorts by next run, index-backed.

-- A job's labels, from its ScheduledJob's metadata (the operator's reconcile and
-- `cronwell apply` write them on every apply); `?label=key=value` is `labels @> {...}`.
ALTER TABLE cronwell_jobs ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';
-- jsonb_path_ops: smaller than the default opclass and serves exactly `@>`.
CREATE INDEX cronwell_jobs_labels ON cronwell_jobs USING gin (labels jsonb_path_ops)
    WHERE deleted_at IS NULL;
-- Live jobs in next-run order (a job whose schedule ended, NULL, last), with the name as
-- the tie-break the keyset cursor carries: one index range scan per page.
CREATE INDEX cronwell_jobs_live_next ON cronwell_jobs
    ((coalesce(next_run_at, 'infinity'::timestamptz)), namespace, name)
    WHERE deleted_at IS NULL;
