-- 0011: the dashboard's runs of one pool (issue 29: /runs?pool=), newest first.

-- UiRunPage with ?pool=: a range of this index in the page's order, keyset on
-- (scheduled_for, id), a time window (?since=/?until=/?window=) narrowing the same range.
-- Without it a pool's page walked every run newest first (cronwell_occurrences_recent, 0010)
-- and filtered on the pool: a page of a small pool read the whole table. Like every index
-- on the table it costs each state change one more index entry (a state change is not a
-- HOT update): one (text, timestamptz, bigint) entry.
CREATE INDEX cronwell_occurrences_pool ON cronwell_occurrences
    (pool, scheduled_for DESC, id DESC);
