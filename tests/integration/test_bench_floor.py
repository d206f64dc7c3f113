"""The bench's floor (bench/ceiling.py) on a real server: its drivers claim and complete
every row, and its CPU figures are measured, not left at zero."""

from __future__ import annotations

from bench import ceiling
from cronwell.store.db import Database


async def test_the_floor_claims_and_completes_every_row(db: Database, db_url: str) -> None:
    figs = await ceiling.floor(db, db_url, 3_000, 2, 500)
    assert figs["succeeded"] == 3_000
    assert figs["workers"] == 2
    assert figs["postgres_cpu_ms_per_occurrence"] > 0
    assert figs["one_claimer_postgres_cpu_ms_per_occurrence"] > 0
    assert figs["insert_postgres_cpu_ms_per_occurrence"] >= 0
    async with db.connection() as conn:
        cur = await conn.execute("SELECT to_regclass('bench_floor') IS NULL AS gone")
        assert (await cur.fetchone() or {})["gone"]
