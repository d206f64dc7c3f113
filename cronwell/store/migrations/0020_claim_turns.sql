-- 0020: the claims of one pool take turns (issue 30): dispatch.claim first takes the
-- pool's turn, a transaction-level advisory lock, waiting for it at most `wait_ms`.
--
-- Claimers that ran at once walked the same head of the claim index: each stepped over
-- the rows the other held (SKIP LOCKED), and a serialised job's occurrence whose
-- predecessor the other held was held back to a later claim (dispatch.hold_back), so the
-- oldest due rows were the ones passed over. Taking turns, each claim takes the oldest
-- due rows, nothing held back (bench/README.md, "Claims take turns").
--
-- The turn is a preference, never a correctness guard (SKIP LOCKED and the hold-back
-- still are): a claim that waited `wait_ms` without getting it (the holder paused or cut
-- off mid-claim: its lock lasts as long as its transaction) claims beside the holder as
-- before. Only a claim that finds the turn taken enters the exception block (a
-- subtransaction); the lock it acquires there stays with the claim's transaction.
-- lock_timeout is set for that wait only and put back.
CREATE OR REPLACE FUNCTION cronwell_claim_turn(lock_class integer, lock_key integer,
                                               wait_ms integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    before text := current_setting('lock_timeout');
BEGIN
    IF pg_try_advisory_xact_lock(lock_class, lock_key) THEN
        RETURN true;
    END IF;
    IF wait_ms <= 0 THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
        PERFORM pg_advisory_xact_lock(lock_class, lock_key);
        PERFORM set_config('lock_timeout', before, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', before, true);
        RETURN false;
    END;
END $$;
