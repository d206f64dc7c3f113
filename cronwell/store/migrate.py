"""Versioned migrations: idempotent, serialised by an advisory lock, refusing a newer schema."""

from __future__ import annotations

import logging
import re
from importlib import resources

from cronwell.errors import SchemaTooNew
from cronwell.store.db import Database

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


async def migrate(db: Database) -> list[int]:
    """Apply the missing migrations in one transaction; return the versions applied."""
    applied: list[int] = []
    async with db.transaction() as conn:
        await db.execute("MigrationLock", conn=conn)
        await db.execute("MigrationTableCreate", conn=conn)
        done = {r["version"] for r in await db.fetch("MigrationList", conn=conn)}
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
            await db.execute("MigrationRecord", {"version": version, "name": name}, conn=conn)
            applied.append(version)
    return applied


async def check_schema(db: Database) -> None:
    """Refuse to run against a schema newer than the code (or a missing one)."""
    async with db.connection() as conn:
        await db.execute("MigrationTableCreate", conn=conn)
        done = {r["version"] for r in await db.fetch("MigrationList", conn=conn)}
    newest = max(done, default=0)
    if newest > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database schema is at version {newest}, newer than this cronwell "
            f"({SCHEMA_VERSION}): upgrade cronwell"
        )
