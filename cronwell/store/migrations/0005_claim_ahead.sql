-- 0005: claim ahead. A worker claims an occurrence up to a few seconds before its instant
-- and starts it then, so the claim and the start are two moments: claimed_at is when the
-- claim took it, started_at (NULL until then) when its attempt actually began. An
-- occurrence whose lease expired while started_at was NULL never ran: it is not an attempt
-- (not ambiguous under AtMostOnce), and the reaper gives it back unconsumed.
ALTER TABLE cronwell_occurrences ADD COLUMN claimed_at timestamptz;
