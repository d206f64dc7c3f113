-- Migration bookkeeping (cronwell_migrations): which versions are applied, taken under a lock.

-- name: MigrationLock
-- Serialises concurrent `migrate` runs (replicas starting together).
SELECT pg_advisory_xact_lock(7367211650142);

-- name: MigrationTableCreate
-- Bookkeeping of applied migrations.
CREATE TABLE IF NOT EXISTS cronwell_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: MigrationList
-- Versions already applied.
SELECT version FROM cronwell_migrations ORDER BY version;

-- name: MigrationRecord
-- Marks one migration applied.
INSERT INTO cronwell_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: SchemaPresent
-- Whether a cronwell schema exists at all (read-only: checking never creates it).
SELECT to_regclass('cronwell_migrations') IS NOT NULL AS present;
