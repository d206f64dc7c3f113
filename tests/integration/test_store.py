"""Migrations and the shape of the hot queries, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from cronwell import dispatch, partitions
from cronwell.embedded import EmbeddedPostgres
from cronwell.errors import DatabaseUnavailable, PartitionMismatch, SchemaMissing, SchemaTooNew
from cronwell.store import Database, claims, leases, migrate
from cronwell.store._queries import q
from cronwell.store.db import dataclass_row
from cronwell.store.migrate import SCHEMA_VERSION, check_schema, record, schema_present
from cronwell_operator.testing import create_database

from .helpers import sql


async def test_migrate_is_idempotent_and_concurrent_safe(empty_db_url: str) -> None:
    dbs = [Database(empty_db_url) for _ in range(4)]
    for d in dbs:
        await d.open()
    try:
        results = await asyncio.gather(*(migrate(d) for d in dbs))
        assert sorted(results, key=len) == [[], [], [], list(range(1, SCHEMA_VERSION + 1))]
        assert await migrate(dbs[0]) == []
    finally:
        for d in dbs:
            await d.close()


async def test_refuses_a_newer_schema(db: Database) -> None:
    await record(db, version=SCHEMA_VERSION + 1, name="future")
    with pytest.raises(SchemaTooNew, match="newer than this cronwell"):
        await migrate(db)
    with pytest.raises(SchemaTooNew):
        await check_schema(db)


async def test_check_schema_refuses_a_missing_schema_without_creating_one(
    empty_db_url: str,
) -> None:
    """A process that does not migrate (the operator) must refuse an empty database, and
    checking must not create tables in it."""
    async with Database(empty_db_url) as db:
        with pytest.raises(SchemaMissing, match="run `cronwell migrate`"):
            await check_schema(db)
        assert await schema_present(db) is False
        await migrate(db)
        await check_schema(db)


async def test_migrate_stores_the_partition_count_of_a_new_store(empty_db_url: str) -> None:
    async with Database(empty_db_url) as db:
        await migrate(db, partitions=5)
        await migrate(db)  # a store that has a count keeps it
        assert await partitions.read(db) == 5
        assert len(await leases.list_all(db)) == 5
        with pytest.raises(PartitionMismatch, match="configured with 8 partitions but the store"):
            await partitions.check(db, 8)


async def test_unreachable_database_is_a_clear_error() -> None:
    db = Database("postgresql://nobody@127.0.0.1:1/none", connect_timeout_seconds=1)
    with pytest.raises(
        DatabaseUnavailable,
        match=r"cannot connect to PostgreSQL at "
        r"postgresql://nobody@127.0.0.1:1/none: .*CRONWELL_DATABASE_URL",
    ):
        await db.open()


async def test_password_is_redacted(pg_server: Any) -> None:
    url = f"postgresql://postgres:hunter2@127.0.0.1:{pg_server.port}/does_not_exist"
    with pytest.raises(DatabaseUnavailable) as e:
        await Database(url, connect_timeout_seconds=1).open()
    assert "hunter2" not in str(e.value) and "***" in str(e.value)
    assert "does_not_exist" in str(e.value)


async def _plan(db: Database, name: str, params: dict[str, Any]) -> str:
    async with db.connection() as conn:
        cur = await conn.execute(psycopg.sql.SQL("EXPLAIN ") + psycopg.sql.SQL(q(name)), params)
        return "\n".join(r["QUERY PLAN"] for r in await cur.fetchall())


_FILL = """
INSERT INTO cronwell_partitions (partition, holder, epoch, expires_at)
SELECT p, 'h', 1, now() + interval '1 hour' FROM generate_series(0, 15) p
ON CONFLICT (partition) DO UPDATE SET holder = 'h', epoch = 1, expires_at = excluded.expires_at;
INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition, next_run_at)
SELECT gen_random_uuid(), 'default', 'j' || i, '{}', '', 'default', i % 16,
       now() + (i % 86400) * interval '1 second'
FROM generate_series(1, 50000) i;
INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for, run_at, state,
                                  overlap, delivery, max_attempts, timeout_seconds)
SELECT j.id || ':' || g, j.id, 'default', now() - g * interval '1 minute',
       now() - g * interval '1 minute', CASE WHEN g = 1 THEN 'pending' ELSE 'succeeded' END,
       'Allow', 'AtLeastOnce', 3, 60
FROM (SELECT id FROM cronwell_jobs LIMIT 20000) j, generate_series(1, 5) g;
ANALYZE;
"""


async def test_hot_queries_are_index_range_scans(db: Database) -> None:
    """With 50k jobs and 100k occurrences, the due scan, the claim and the reaper read
    their indexes (range scans), never the whole table."""
    async with db.connection() as conn:
        await conn.execute(_FILL)  # type: ignore[arg-type]
    due = await _plan(
        db,
        "JobDueClaim",
        {"holder": "h", "partition": 3, "epoch": 1, "horizon": 30, "limit": 1000},
    )
    assert "cronwell_jobs_due" in due, due
    claim = await _plan(
        db,
        "OccurrenceClaimCandidates",
        {
            "pool": "default",
            "limit": 100,
            "ahead": 2.0,
            "serial": dispatch.SERIAL_ORDER,
            "until": claims.LATEST,
        },
    )
    assert "cronwell_occurrences_claim" in claim, claim
    # a serialised candidate's previous occurrence: one probe of the job's index (a day
    # partition's copy of it is named by PostgreSQL after its columns)
    assert re.search(r"cronwell_occurrences_(job|p\w*_job_id_scheduled_for_idx)", claim), claim
    reap = await _plan(db, "LeaseReap", {"limit": 100})
    # Each partition holding the rows is read by a partial index of the running rows (with
    # none running, the lease index and the active one cost alike; a day partition's copies
    # are named after their columns), never scanned. An empty partition may be.
    held = await sql(
        db, "SELECT DISTINCT tableoid::regclass::text AS part FROM cronwell_occurrences"
    )
    for part in (r["part"] for r in held):
        assert re.search(rf"Index Scan using \w*(lease|active|job_id_idx)\w* on {part}\b", reap), (
            part,
            reap,
        )
        assert f"Seq Scan on {part} " not in reap, (part, reap)


async def test_claim_start_and_spec_fetch_read_jobs_by_primary_key(db: Database) -> None:
    """Starting a batch of 500 reads each one's job by key: a hash join scanned all 50k jobs
    for every batch (a third of the statement's time in a burst)."""
    async with db.connection() as conn:
        await conn.execute(_FILL)  # type: ignore[arg-type]
    found = await claims.candidates(db, pool="default", limit=500, serial=dispatch.SERIAL_ORDER)
    assert len(found.ids) == 500
    start = await _plan(
        db,
        "OccurrenceClaimBatch",
        {
            "ids": found.ids,
            "conditional": [],
            "worker_id": "w",
            "lease": 60,
            "lo": found.lo,
            "hi": found.hi,
        },
    )
    assert "cronwell_jobs_pkey" in start and "Seq Scan" not in start, start
    jobs = await sql(db, "SELECT id FROM cronwell_jobs LIMIT 5")
    specs = await _plan(db, "JobSpecBatch", {"ids": [j["id"] for j in jobs]})
    assert "cronwell_jobs_pkey" in specs and "Seq Scan" not in specs, specs


async def test_the_gate_of_conditional_claims_reads_by_job_not_the_whole_history(
    db: Database,
) -> None:
    """The gate (ConditionalEarlier) of 500 claims among 100k occurrences reads the jobs'
    active occurrences and the pool's due pending ones through indexes, never a whole
    partition."""
    async with db.connection() as conn:
        await conn.execute(_FILL)  # type: ignore[arg-type]
    rows = await sql(
        db,
        "SELECT id, job_id, scheduled_for, tableoid::regclass::text AS part"
        " FROM cronwell_occurrences WHERE state = 'pending' LIMIT 500",
    )
    (part,) = {r["part"] for r in rows}  # the partition holding them (the others are empty)
    plan = await _plan(
        db,
        "ConditionalEarlier",
        {
            "ids": [r["id"] for r in rows],
            "jobs": [r["job_id"] for r in rows],
            "instants": [r["scheduled_for"] for r in rows],
            "pool": "default",
            "until": max(r["scheduled_for"] for r in rows),
            "over": [],
        },
    )
    scans = [line.strip()[:120] for line in plan.splitlines() if f" on {part} " in line]
    assert len(scans) == 2 and not [s for s in scans if "Seq Scan" in s], scans


@dataclass(frozen=True, slots=True)
class _Pair:
    a: int
    b: str = "default"


async def test_rows_are_built_by_field_name_whatever_the_column_order(db: Database) -> None:
    """dataclass_row passes values positionally only when the columns are the fields in
    order: a query naming them in another order still fills each field by its name."""
    async with db.connection() as conn:
        for sql, want in (
            ("SELECT 1 AS a, 'x' AS b", _Pair(1, "x")),  # field order: positional
            ("SELECT 'x' AS b, 1 AS a", _Pair(1, "x")),  # another order: by name
            ("SELECT 1 AS a", _Pair(1)),  # a prefix of the fields: the rest default
            ("SELECT 'x' AS b", None),  # a required field missing: an error, not a guess
        ):
            async with conn.cursor(row_factory=dataclass_row(_Pair)) as cur:
                if want is None:
                    with pytest.raises(TypeError):
                        await cur.execute(sql)
                        await cur.fetchall()
                    continue
                await cur.execute(sql)
                assert await cur.fetchall() == [want], sql


@pytest.mark.parametrize(("collation", "keys"), [("C.UTF-8", "C"), ("C", "default")])
async def test_keys_and_pools_compare_in_byte_order_whatever_the_database(
    pg_server: EmbeddedPostgres, collation: str, keys: str
) -> None:
    """Migration 0018: on a database whose default collation is linguistic, the columns
    every hot write indexes by text (occurrence keys and pools, attempt keys) compare
    byte by byte ("C"), in the partitioned history's every partition too; on a database
    that is "C" already nothing is altered (no index rebuilt for nothing)."""
    url = create_database(
        pg_server.port,
        "template0",
        f"coll_{keys.lower()}_{os.getpid()}",
        f"LOCALE_PROVIDER libc LC_COLLATE '{collation}' LC_CTYPE '{collation}'",
    )
    async with Database(url) as db:
        await migrate(db)
        rows = await sql(
            db,
            "SELECT c.relname || '.' || a.attname AS col, l.collname AS coll"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_collation l ON l.oid = a.attcollation"
            " WHERE (c.relname LIKE 'cronwell_occurrences%%' AND a.attname IN"
            "        ('idempotency_key', 'pool')"
            "     OR c.relname LIKE 'cronwell_attempts%%' AND a.attname = 'idempotency_key')"
            "  AND c.relkind IN ('r', 'p')",
        )
    parts = {r["col"].split(".")[0] for r in rows}
    assert {"cronwell_occurrences", "cronwell_attempts"} < parts and len(parts) > 2, parts
    assert {r["coll"] for r in rows} == {keys}, rows
