-- 0010: indexes for the dashboard's run lists (issue 29: every page <= 300 ms p99 at 100k
-- jobs / 10M runs, index scans only).

-- /runs (UiRunPage; RunsList): every run newest first, keyset on (scheduled_for, id). Without
-- it each page sorted the whole table (10M rows: seconds). scheduled_for and id never change,
-- but a state change is not a HOT update (state is in the partial indexes' predicates), so
-- this index costs every claim, start and completion one more index entry: measured with
-- the `burst` bench (bench/README.md).
CREATE INDEX cronwell_occurrences_recent ON cronwell_occurrences (scheduled_for DESC, id DESC);

-- /runs?state= of the states a run ends in off the hot path (skipped, missed, cancelled):
-- their runs newest first. Without it such a page walked every run newest first
-- (cronwell_occurrences_recent) filtering on the state: 2.4 s at 10M runs when the
-- cancelled runs were days old. Partial: a claim, start or success never writes to it
-- (pending, running, succeeded rows are outside it; dead ones have their index below).
CREATE INDEX cronwell_occurrences_rare ON cronwell_occurrences (state, scheduled_for DESC, id DESC)
    WHERE state IN ('skipped', 'missed', 'cancelled');

-- /dead and its counts (UiDeadList, DeadList, DeadMatchCount, DeadCount): dead letters newest
-- first. Partial: only a death or a replay writes to it, never the hot path's claims and
-- successes. Before, a dead-letter page read the finished_at index backwards past every
-- successful run and a count read every occurrence.
CREATE INDEX cronwell_occurrences_dead ON cronwell_occurrences
    (finished_at DESC NULLS LAST, id DESC) WHERE state = 'dead';

-- /runs?job= (UiRunPage), /dead?job= and its counts: jobs by name, live and deleted (a
-- deleted job's runs and dead letters stay listed). cronwell_jobs_live_name holds live jobs
-- only, so `name = X` without `deleted_at IS NULL` scanned every job (100k: tens of ms).
-- A job row is rewritten (not a HOT update: next_run_at is indexed) each time the
-- scheduler materialises it: one more index entry per materialisation.
CREATE INDEX cronwell_jobs_name ON cronwell_jobs (name);
