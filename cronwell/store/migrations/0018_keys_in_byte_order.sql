-- 0018: idempotency keys and pools compare byte by byte (COLLATE "C"), whatever the
-- database's default collation (issue 30).
--
-- Every occurrence written (materialisation, claim, completion: none is a HOT update) adds
-- an entry to the unique key index, and every success one to the attempts' one-success
-- index: a descent of each comparing distinct keys. Under a linguistic collation (a
-- database created with en_US.UTF-8, managed PostgreSQL's usual default, or C.UTF-8 from
-- an environment's LANG) each comparison is a strcoll() call; under "C" a memcmp. The
-- keys are ASCII (`<job uid>:<instant>`, `<job uid>:trigger:<id>`) and pools are
-- Kubernetes names, so equality is the same and order the same as C.UTF-8's; a
-- linguistic order of them meant nothing. Measured (bench/README.md, "One index fewer,
-- and keys in byte order"): on an en_US.UTF-8 database, PostgreSQL's CPU per occurrence
-- at 10,000 per-second jobs 0.121-0.133 ms before, 0.110-0.114 after; on C.UTF-8 (glibc
-- collates it by code point) no difference measured.
--
-- Changing a column's collation rebuilds the indexes on it (not the table) under this
-- migration's lock: on a large store the upgrade's migration Job holds the history tables
-- for that long (docs/deploy.md, "Upgrading"). A database whose default collation is
-- already "C" or "POSIX" (CloudNativePG's default) compares in byte order already: nothing
-- is rebuilt there.
DO $$
DECLARE
    byte_order boolean;
BEGIN
    -- datlocprovider (PostgreSQL 15+) read through to_jsonb: absent before 15 (libc).
    SELECT d.datcollate IN ('C', 'POSIX')
           AND coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'
    INTO byte_order
    FROM pg_database d WHERE d.datname = current_database();
    IF NOT byte_order THEN
        ALTER TABLE cronwell_occurrences
            ALTER COLUMN idempotency_key TYPE text COLLATE "C",
            ALTER COLUMN pool TYPE text COLLATE "C";
        ALTER TABLE cronwell_attempts ALTER COLUMN idempotency_key TYPE text COLLATE "C";
    END IF;
END $$;
