"""The bench's floor and tasks drivers (bench/ceiling.py) on a real server: they claim and
complete every row, and their CPU figures are measured, not left at zero."""

from __future__ import annotations

from bench import burst, ceiling
from cronwell.store.db import Database


async def test_the_floor_claims_and_completes_every_row(db: Database, db_url: str) -> None:
    figs = await ceiling.floor(db, db_url, 3_000, 2, 500)
    assert figs["succeeded"] == 3_000
    assert figs["workers"] == 2
    assert figs["postgres_cpu_ms_per_occurrence"] > 0
    assert figs["one_claimer_postgres_cpu_ms_per_occurrence"] > 0
    assert figs["insert_postgres_cpu_ms_per_occurrence"] >= 0
    assert figs["worker_cpu_ms_per_occurrence"] > 0
    async with db.connection() as conn:
        cur = await conn.execute("SELECT to_regclass('bench_floor') IS NULL AS gone")
        assert (await cur.fetchone() or {})["gone"]


async def test_the_tasks_driver_starts_and_completes_every_occurrence(
    db: Database, db_url: str
) -> None:
    """Claimed ahead, each occurrence is completed with its start instant and an attempt
    row, as cronwell's completion leaves it."""
    await burst.prepare_burst(db, 2_000, 4)
    figs = await ceiling.tasks(db, db_url, 2_000, 2, 500)
    assert figs["succeeded"] == 2_000
    assert figs["worker_cpu_ms_per_occurrence"] > 0
    assert figs["postgres_cpu_ms_per_occurrence"] > 0
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE started_at IS NULL) AS unstarted,"
            " (SELECT count(*) FROM cronwell_attempts WHERE outcome = 'succeeded') AS attempts"
            " FROM cronwell_occurrences"
        )
        assert await cur.fetchone() == {"unstarted": 0, "attempts": 2_000}
