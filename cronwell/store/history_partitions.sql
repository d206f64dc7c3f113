-- History partitioned by nominal instant (cronwell/store/history_partitions.py, issue 31):
-- the online conversion of a legacy store, partition maintenance and retention by partition.

-- name: HistoryShape
-- Whether each history table is already partitioned ('p') or still a plain table ('r'): the
-- shape is read from the catalog, never from a version number.
SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass('cronwell_occurrences'))
           AS occurrences,
       (SELECT relkind::text FROM pg_class WHERE oid = to_regclass('cronwell_attempts'))
           AS attempts;

-- name: HistoryConvertLock
-- Serialises concurrent conversions (a `cronwell migrate` and schedulers starting, which
-- migrate too): held by the session across the steps, which are separate transactions. A
-- try, polled: a session waiting in pg_advisory_lock keeps a transaction open, which the
-- holder's CREATE INDEX CONCURRENTLY would wait for (a deadlock).
SELECT pg_try_advisory_lock(7367211650143);

-- name: HistoryConvertUnlock
-- Releases HistoryConvertLock (the connection goes back to the pool).
SELECT pg_advisory_unlock(7367211650143);

-- name: HistoryLockTimeout
-- The strong locks of the conversion and of partition drops wait at most this long, so a
-- long query on the table makes us retry later instead of queueing every writer behind us.
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: HistoryInvalidIndexes
-- Step-1 indexes left INVALID by an interrupted CREATE INDEX CONCURRENTLY: dropped and
-- rebuilt (IF NOT EXISTS would otherwise keep the useless index for good).
SELECT c.relname AS name
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname IN ('cronwell_occurrences_id_instant', 'cronwell_occurrences_key_instant',
                    'cronwell_attempts_one_success_instant')
  AND NOT i.indisvalid;

-- name: HistoryIndexDropOccId
-- Drops an invalid step-1 index without blocking writers (outside a transaction).
DROP INDEX CONCURRENTLY IF EXISTS cronwell_occurrences_id_instant;

-- name: HistoryIndexDropOccKey
-- Drops an invalid step-1 index without blocking writers (outside a transaction).
DROP INDEX CONCURRENTLY IF EXISTS cronwell_occurrences_key_instant;

-- name: HistoryIndexDropAttSuccess
-- Drops an invalid step-1 index without blocking writers (outside a transaction).
DROP INDEX CONCURRENTLY IF EXISTS cronwell_attempts_one_success_instant;

-- name: HistoryIndexBuildOccId
-- Step 1: the future primary key (id, scheduled_for) of the legacy occurrences, built while
-- writers run (it becomes the legacy partition's key at the switch: no build under a lock).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS cronwell_occurrences_id_instant
    ON cronwell_occurrences (id, scheduled_for);

-- name: HistoryIndexBuildOccKey
-- Step 1: the future unique key (idempotency_key, scheduled_for); the key embeds the instant,
-- so including the partition column keeps its meaning.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS cronwell_occurrences_key_instant
    ON cronwell_occurrences (idempotency_key, scheduled_for);

-- name: HistoryIndexBuildAttSuccess
-- Step 1: the partitioned form of invariant 1 (one success per key), built while writers run.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS cronwell_attempts_one_success_instant
    ON cronwell_attempts (idempotency_key, scheduled_for) WHERE outcome = 'succeeded';

-- name: HistoryCutover
-- Step 2: the cutover instant C, read back from the validated (or half-done) CHECK of an
-- interrupted run, else the later of the start of the day after tomorrow (UTC) and the day
-- after the newest instant (each job's newest: a probe of cronwell_occurrences_job a job).
SELECT coalesce(
    (SELECT obj_description(oid, 'pg_constraint')::timestamptz FROM pg_constraint
     WHERE conrelid = 'cronwell_occurrences'::regclass
       AND conname = 'cronwell_occurrences_before_cutover'),
    greatest((date_trunc('day', now() AT TIME ZONE 'UTC') + interval '2 days')
                 AT TIME ZONE 'UTC',
             (SELECT (date_trunc('day', max(l.latest) AT TIME ZONE 'UTC')
                      + interval '1 day') AT TIME ZONE 'UTC'
              FROM cronwell_jobs j
              CROSS JOIN LATERAL (SELECT max(o.scheduled_for) AS latest
                                  FROM cronwell_occurrences o WHERE o.job_id = j.id) l)))
    AS cutover;

-- name: HistoryCheckState
-- Step 2's progress: each cutover CHECK and whether it is validated (NULL: not added yet).
SELECT (SELECT convalidated FROM pg_constraint
        WHERE conrelid = 'cronwell_occurrences'::regclass
          AND conname = 'cronwell_occurrences_before_cutover') AS occurrences,
       (SELECT convalidated FROM pg_constraint
        WHERE conrelid = 'cronwell_attempts'::regclass
          AND conname = 'cronwell_attempts_before_cutover') AS attempts;

-- name: HistoryCheckAdd
-- Step 2: both cutover CHECKs, NOT VALID (a brief ACCESS EXCLUSIVE lock, no scan), C kept in
-- the constraint's comment so an interrupted run resumes with the same instant. format()
-- because DDL takes no parameters; the literal is quoted by format's L.
DO $$ BEGIN
    EXECUTE format('ALTER TABLE cronwell_occurrences ADD CONSTRAINT '
                   'cronwell_occurrences_before_cutover CHECK (scheduled_for < %L) NOT VALID',
                   current_setting('cronwell.cutover'));
    EXECUTE format('COMMENT ON CONSTRAINT cronwell_occurrences_before_cutover '
                   'ON cronwell_occurrences IS %L', current_setting('cronwell.cutover'));
    EXECUTE format('ALTER TABLE cronwell_attempts ADD CONSTRAINT '
                   'cronwell_attempts_before_cutover CHECK (scheduled_for IS NULL OR '
                   'scheduled_for < %L) NOT VALID', current_setting('cronwell.cutover'));
END $$;

-- name: HistoryCutoverSet
-- Passes C to the DO block above (a DO block takes no parameters): transaction-local.
SELECT set_config('cronwell.cutover', %(cutover)s::timestamptz::text, true);

-- name: HistoryWidthSet
-- Passes the partition width (seconds) to the switch's DO block: transaction-local.
SELECT set_config('cronwell.partition_seconds', %(seconds)s::text, true);

-- name: HistoryCheckDrop
-- A CHECK whose validation failed (a row past C arrived before the CHECK): dropped, and
-- step 2 starts again with a later C.
ALTER TABLE cronwell_occurrences DROP CONSTRAINT IF EXISTS cronwell_occurrences_before_cutover;
ALTER TABLE cronwell_attempts DROP CONSTRAINT IF EXISTS cronwell_attempts_before_cutover;

-- name: HistoryCheckValidateOcc
-- Step 2: scans the legacy occurrences under SHARE UPDATE EXCLUSIVE: no writer waits.
ALTER TABLE cronwell_occurrences VALIDATE CONSTRAINT cronwell_occurrences_before_cutover;

-- name: HistoryCheckValidateAtt
-- Step 2: scans the legacy attempts under SHARE UPDATE EXCLUSIVE: no writer waits.
ALTER TABLE cronwell_attempts VALIDATE CONSTRAINT cronwell_attempts_before_cutover;

-- name: HistorySwitch
-- Step 3, one short transaction of catalog-only work: the legacy tables become partitions of
-- new partitioned parents (occurrences [MINVALUE, C), attempts the DEFAULT, whose rows may
-- lack the instant), every index and trigger moves to the parent without a build, identity
-- becomes a sequence (identity is not allowed on a partitioned table on PG 15), and the first
-- partition [C, C + width) is created (width: HistoryWidthSet). A no-op once
-- cronwell_occurrences is partitioned.
DO $$
DECLARE
    c timestamptz;
    w interval;
    r record;
    seq record;
    t text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'cronwell_occurrences'::regclass) = 'p' THEN
        RETURN;
    END IF;
    SELECT obj_description(oid, 'pg_constraint')::timestamptz INTO c FROM pg_constraint
    WHERE conrelid = 'cronwell_occurrences'::regclass AND convalidated
      AND conname = 'cronwell_occurrences_before_cutover';
    IF c IS NULL OR NOT EXISTS (SELECT 1 FROM pg_constraint
                                WHERE conrelid = 'cronwell_attempts'::regclass AND convalidated
                                  AND conname = 'cronwell_attempts_before_cutover') THEN
        RAISE EXCEPTION 'cronwell history switch: the cutover CHECKs are not validated';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE contype = 'f' AND confrelid IN
               ('cronwell_occurrences'::regclass, 'cronwell_attempts'::regclass)) THEN
        RAISE EXCEPTION 'cronwell history switch: a foreign key references the history tables';
    END IF;
    -- Writers lock occurrences then attempts (completion): the same order, no deadlock.
    LOCK TABLE cronwell_occurrences, cronwell_attempts IN ACCESS EXCLUSIVE MODE;

    FOREACH t IN ARRAY ARRAY['cronwell_occurrences', 'cronwell_attempts'] LOOP
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t, t || '_legacy');
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS) '
                       'PARTITION BY RANGE (scheduled_for)', t, t || '_legacy');
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t, t || '_before_cutover');
        -- Identity -> a sequence carrying on from the identity's position (NULL: unused).
        SELECT s.last_value INTO seq
        FROM pg_sequences s
        WHERE format('%I.%I', s.schemaname, s.sequencename)::regclass
              = pg_get_serial_sequence(t || '_legacy', 'id')::regclass;
        EXECUTE format('ALTER TABLE %I ALTER COLUMN id DROP IDENTITY', t || '_legacy');
        EXECUTE format('CREATE SEQUENCE %I AS bigint OWNED BY %I.id', t || '_id_seq', t);
        IF seq.last_value IS NOT NULL THEN
            PERFORM setval(format('%I', t || '_id_seq')::regclass, seq.last_value, true);
        END IF;
        EXECUTE format('ALTER TABLE %I ALTER COLUMN id SET DEFAULT nextval(%L)', t,
                       t || '_id_seq');
        -- Privileges granted on the legacy table (a reporting role, say) carry over; a role
        -- that inserts needs the sequence too (an identity needed nothing more).
        FOR r IN
            SELECT a.privilege_type AS priv,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS who
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = (t || '_legacy')::regclass AND a.grantee <> c.relowner
        LOOP
            EXECUTE format('GRANT %s ON %I TO %s', r.priv, t, r.who);
            IF r.priv = 'INSERT' THEN
                EXECUTE format('GRANT USAGE ON SEQUENCE %I TO %s', t || '_id_seq', r.who);
            END IF;
        END LOOP;
    END LOOP;

    -- Occurrences: the old single-column keys give way to the step-1 indexes, which become
    -- the legacy partition's constraints and match the parent's (attached, not built).
    ALTER TABLE cronwell_occurrences_legacy DROP CONSTRAINT cronwell_occurrences_pkey;
    ALTER TABLE cronwell_occurrences_legacy DROP CONSTRAINT cronwell_occurrences_key;
    ALTER TABLE cronwell_occurrences_legacy ADD CONSTRAINT cronwell_occurrences_legacy_pkey
        PRIMARY KEY USING INDEX cronwell_occurrences_id_instant;
    ALTER TABLE cronwell_occurrences_legacy ADD CONSTRAINT cronwell_occurrences_legacy_key
        UNIQUE USING INDEX cronwell_occurrences_key_instant;
    ALTER TABLE cronwell_occurrences ADD CONSTRAINT cronwell_occurrences_pkey
        PRIMARY KEY (id, scheduled_for);
    ALTER TABLE cronwell_occurrences ADD CONSTRAINT cronwell_occurrences_key
        UNIQUE (idempotency_key, scheduled_for);
    -- Attempts: the legacy keeps its PK (id) and its key-only one-success index locally (they
    -- cover its rows, NULL instants included); they move aside under a _legacy name.
    ALTER INDEX cronwell_attempts_pkey RENAME TO cronwell_attempts_legacy_pkey;
    ALTER INDEX cronwell_attempts_one_success RENAME TO cronwell_attempts_one_success_legacy;

    -- Every other index: renamed aside on the legacy table, created under its own name on the
    -- still empty parent (instant); ATTACH PARTITION below then adopts the legacy's matching
    -- index instead of building one.
    FOR r IN
        SELECT c.relname AS name, t.relname AS tab, i.indisunique AS uniq,
               substring(pg_get_indexdef(i.indexrelid) FROM ' USING .*$') AS body
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_class t ON t.oid = i.indrelid
        WHERE t.relname IN ('cronwell_occurrences_legacy', 'cronwell_attempts_legacy')
          AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
          AND c.relname NOT LIKE '%\_legacy'
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.name, r.name || '_legacy');
        EXECUTE format('CREATE %s INDEX %I ON %I %s',
                       CASE WHEN r.uniq THEN 'UNIQUE' ELSE '' END, r.name,
                       replace(r.tab, '_legacy', ''), r.body);
    END LOOP;

    -- Statement-level triggers (with transition tables: allowed on a partitioned parent) move
    -- to the parents, same functions.
    FOR r IN
        SELECT tg.tgname AS name, t.relname AS tab, pg_get_triggerdef(tg.oid) AS def
        FROM pg_trigger tg JOIN pg_class t ON t.oid = tg.tgrelid
        WHERE t.relname IN ('cronwell_occurrences_legacy', 'cronwell_attempts_legacy')
          AND NOT tg.tgisinternal
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %I', r.name, r.tab);
        EXECUTE regexp_replace(r.def, ' ON (\S+\.)?' || r.tab || ' ',
                               ' ON ' || replace(r.tab, '_legacy', '') || ' ');
    END LOOP;

    -- No scan: the validated CHECKs imply the partition bounds.
    EXECUTE format('ALTER TABLE cronwell_occurrences ATTACH PARTITION '
                   'cronwell_occurrences_legacy FOR VALUES FROM (MINVALUE) TO (%L)', c);
    ALTER TABLE cronwell_attempts ATTACH PARTITION cronwell_attempts_legacy DEFAULT;
    -- The first partition [C, C + width), named as partition_name() names it.
    w := make_interval(secs => current_setting('cronwell.partition_seconds')::int);
    t := '_p' || to_char(c AT TIME ZONE 'UTC',
                         CASE WHEN w = interval '1 day' THEN 'YYYYMMDD' ELSE 'YYYYMMDD_HH24MI' END);
    EXECUTE format('CREATE TABLE %I PARTITION OF cronwell_occurrences FOR VALUES FROM (%L) TO (%L)',
                   'cronwell_occurrences' || t, c, c + w);
    EXECUTE format('CREATE TABLE %I PARTITION OF cronwell_attempts FOR VALUES FROM (%L) TO (%L)',
                   'cronwell_attempts' || t, c, c + w);
END $$;

-- name: HistoryPartitionList
-- The partitions of both history tables with their bounds (lo NULL: MINVALUE; both NULL: the
-- DEFAULT), the reltuples estimate of their rows, oldest first.
SELECT p.relname AS parent, c.relname AS name,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                     'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lo,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                     'TO \(''([^'']+)''\)'))[1]::timestamptz AS hi,
       greatest(c.reltuples, 0)::bigint AS rows
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
WHERE p.oid IN (to_regclass('cronwell_occurrences'), to_regclass('cronwell_attempts'))
  AND p.relkind = 'p'
ORDER BY p.relname, hi NULLS FIRST;

-- name: HistoryPartitionCreate
-- A new partition [lo, hi) of one parent without an ACCESS EXCLUSIVE lock on it: a table
-- LIKE the parent with a CHECK matching the bounds, then ATTACH PARTITION (SHARE UPDATE
-- EXCLUSIVE on the parent; the CHECK also spares the scan, and a DEFAULT partition's CHECK
-- spares its scan). Parameters reach the DO block through transaction-local settings.
DO $$
DECLARE
    parent text := current_setting('cronwell.part_parent');
    part text := current_setting('cronwell.part_name');
    lo timestamptz := current_setting('cronwell.part_lo')::timestamptz;
    hi timestamptz := current_setting('cronwell.part_hi')::timestamptz;
BEGIN
    IF to_regclass(part) IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   part, parent);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (scheduled_for IS NOT NULL AND '
                   'scheduled_for >= %L AND scheduled_for < %L)', part, part || '_bounds', lo, hi);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   parent, part, lo, hi);
END $$;

-- name: HistoryPartitionArgs
-- Passes a partition's parent, name and bounds to the DO blocks (transaction-local).
SELECT set_config('cronwell.part_parent', %(parent)s, true),
       set_config('cronwell.part_name', %(name)s, true),
       set_config('cronwell.part_lo', %(lo)s::timestamptz::text, true),
       set_config('cronwell.part_hi', %(hi)s::timestamptz::text, true);

-- name: HistoryPartitionUnfinished
-- Unfinished occurrences in [lo, hi): pruned to that partition, counted through the partial
-- indexes (claim: pending, lease: running, active: waiting). A partition holding any is
-- never dropped.
SELECT count(*) AS n FROM cronwell_occurrences
WHERE scheduled_for >= %(lo)s AND scheduled_for < %(hi)s
  AND state IN ('pending', 'waiting', 'running');

-- name: HistoryPartitionDrop
-- Drops one partition (the attempts one of a range first, then the occurrences one): a
-- brief ACCESS EXCLUSIVE lock on the parent, under the lock timeout.
DO $$ BEGIN
    EXECUTE format('DROP TABLE IF EXISTS %I', current_setting('cronwell.part_name'));
END $$;
