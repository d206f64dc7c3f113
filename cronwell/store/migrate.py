"""Versioned migrations: idempotent, serialised by an advisory lock, refusing a newer schema."""

from __future__ import annotations

import logging
import re
from importlib import resources

from cronwell.errors import SchemaMissing, SchemaTooNew
from cronwell.store import fences, history_partitions
from cronwell.store import partitions as store_partitions
from cronwell.store.db import Conn, Database, row_class

log = logging.getLogger(__name__)
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every packaged migration, in order."""
    found = []
    for entry in resources.files("cronwell.store").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found)


SCHEMA_VERSION = migrations()[-1][0]

MIGRATION_DEADLINE_SECONDS = 3600.0

DEFAULT_PARTITIONS = 16
"""P of a new store when `migrate` is given none: enough for a few scheduler replicas to
share the load; `cronwell partitions set N` changes it online."""


async def migrate(
    db: Database,
    *,
    partitions: int | None = None,
    partition_history: bool = True,
    history_partition_seconds: int = history_partitions.DAY,
) -> list[int]:
    """Apply the missing migrations in one transaction; return the versions applied.
    A new store gets `partitions` as its partition count (else DEFAULT_PARTITIONS); a store
    that has one keeps it (the caller compares, see cronwell.partitions).
    Then, unless `partition_history` is False (benchmarks build the legacy shape with it),
    the history tables are partitioned by instant online (cronwell.store.history_partitions:
    short steps of their own, resumable, not part of the numbered migrations)."""
    applied: list[int] = []
    # Migrations may rewrite large tables: a deadline of their own, not a call's.
    async with db.transaction(deadline_seconds=MIGRATION_DEADLINE_SECONDS) as conn:
        await db.execute("MigrationLock", conn=conn)
        await db.execute("MigrationTableCreate", conn=conn)
        done = await applied_versions(db, conn)
        fresh = not done
        newest = max(done, default=0)
        if newest > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database schema is at version {newest}, newer than this cronwell "
                f"({SCHEMA_VERSION}): upgrade cronwell instead of running an older one"
            )
        for version, name, sql in migrations():
            if version in done:
                continue
            log.info("applying migration", extra={"action": "migrate", "version": version})
            await conn.execute(sql)
            await record(db, version=version, name=name, conn=conn)
            applied.append(version)
        p = partitions or DEFAULT_PARTITIONS
        await store_partitions.init_count(db, partitions=p, conn=conn)
        stored = await store_partitions.count(db, conn)
        await store_partitions.ensure_leases(
            db, partitions=stored if stored is not None else p, conn=conn
        )
    if partition_history:
        await history_partitions.convert(
            db, partition_seconds=history_partition_seconds, fresh=fresh
        )
    await fences.identify(db)
    return applied


async def check_schema(db: Database) -> None:
    """Refuse to run against a schema newer than the code, an older one, or none at all
    (read-only: a process that does not migrate must not create tables either)."""
    async with db.connection() as conn:
        done = await applied_versions(db, conn) if await schema_present(db, conn) else set()
    newest = max(done, default=0)
    if newest > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database schema is at version {newest}, newer than this cronwell "
            f"({SCHEMA_VERSION}): upgrade cronwell"
        )
    if not done:
        raise SchemaMissing("the database has no cronwell schema: run `cronwell migrate` first")
    if newest < SCHEMA_VERSION:
        raise SchemaMissing(
            f"the database schema is at version {newest}, older than this cronwell "
            f"({SCHEMA_VERSION}): run `cronwell migrate` first"
        )
    await fences.identify(db)


@row_class
class AppliedMigration:
    """A row of cronwell_migrations (only the version is read)."""

    version: int


async def applied_versions(db: Database, conn: Conn | None = None) -> set[int]:
    """The migration versions recorded as applied."""
    return {r.version for r in await db.rows(AppliedMigration, "MigrationList", conn=conn)}


async def record(db: Database, *, version: int, name: str, conn: Conn | None = None) -> None:
    """Mark migration `version` applied (in the transaction that applied it)."""
    await db.execute("MigrationRecord", {"version": version, "name": name}, conn=conn)


async def schema_present(db: Database, conn: Conn | None = None) -> bool:
    """Whether the migrations table exists (read-only: checking never creates it)."""
    present: bool = await db.scalar("SchemaPresent", conn=conn)
    return present
