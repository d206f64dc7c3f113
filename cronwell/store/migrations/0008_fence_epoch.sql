-- 0008: fences that never repeat, even when the store forgets (issue 28, invariant 8).
--
-- A fence was nextval('cronwell_fence'). After an asynchronous failover the new primary's
-- sequence lags the old one's, so values already handed out went out again, to other keys.
-- A fence is now (epoch << 40) + counter: the counter is the sequence (at most 2^40 - 1,
-- a clear error past it rather than a silent carry into the epoch), the epoch is
-- generation * 2^14 + timeline. PostgreSQL's timeline grows on every promotion, so a fence
-- issued after one is above every fence issued before it, whatever the standby had
-- received. The generation is the store's own: it grows when the store finds itself on
-- another cluster (a logical restore: its system identifier changed) or when an operator
-- says so (`cronwell db new-generation`, after restoring a physical backup whose timeline
-- the live cluster may already have used). Fences issued before this migration are below
-- 2^40, so the first fence after it is still above every earlier one of the same key.

ALTER SEQUENCE cronwell_fence MAXVALUE 1099511627775;

CREATE TABLE cronwell_store (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    generation        integer NOT NULL DEFAULT 0 CHECK (generation BETWEEN 0 AND 511),
    system_identifier numeric
);
INSERT INTO cronwell_store DEFAULT VALUES;

-- The epoch part of the fences issued now: called once per claim statement. The timeline
-- is read from the current WAL file's name (its first 8 hex digits), which moves to the new
-- timeline the moment a standby is promoted (pg_control_checkpoint's copy waits for the
-- next checkpoint). On a standby it fails ("recovery is in progress"): nothing is claimed
-- there.
CREATE FUNCTION cronwell_fence_base() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tl bigint := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    gen bigint := (SELECT generation FROM cronwell_store);
BEGIN
    IF tl >= 16384 THEN
        RAISE EXCEPTION 'timeline % is past the 16383 a fence can carry', tl
            USING HINT = 'run `cronwell db new-generation` on a fresh cluster (see docs/deploy.md)';
    END IF;
    RETURN (gen * 16384 + tl) * 1099511627776;
END $$;
