-- 0021: the occurrences waiting behind an active one of their job (BufferOne, BufferAll),
-- by job and instant (issue 30).
--
-- The reaper asks every second which jobs have waiting occurrences that nothing active will
-- promote (WaitingStranded), and a completion of a buffered job promotes its oldest waiting
-- one (WaitingPromote). Both found the waiting rows through the partial index of active
-- occurrences (0001: running, waiting, retrying), reading every running row's heap tuple to
-- filter it out, and between two autovacuums every dead entry of the rows that had run: at
-- 10,000 per-second jobs on two cores, 33-63 ms a reaper pass (72,000-113,000 entries read,
-- 7,600-12,600 pages) for no waiting row at all, 3-4% of PostgreSQL's time. This index holds
-- waiting rows only: a claim, start or completion never writes to it, and with none waiting
-- the reaper's question is one empty page.
--
-- Built in the migration's transaction, as every index before it: each history partition
-- is read once under a lock that holds writes back for that time (0.1 s per million runs
-- kept on a 2-core machine; docs/deploy.md, "Upgrading").
CREATE INDEX IF NOT EXISTS cronwell_occurrences_waiting ON cronwell_occurrences
    (job_id, scheduled_for) WHERE state = 'waiting';
