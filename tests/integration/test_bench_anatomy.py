"""The bench's anatomy (bench/anatomy.py) on a real server: every variant's lifecycle takes
each occurrence from pending to succeeded (the history it leaves is what cronwell's would
be), and its CPU figures are measured, not left at zero."""

from __future__ import annotations

import pytest

from bench import anatomy
from bench.common import seed
from cronwell.store.db import Database

VARIANTS = [*anatomy.VARIANTS.items(), (anatomy.NARROW_NAME, None)]


@pytest.mark.parametrize(("name", "prepare"), VARIANTS, ids=[v[0] for v in VARIANTS])
async def test_each_variant_drives_every_occurrence_to_success(
    db: Database, name: str, prepare: list[str] | None
) -> None:
    await seed(db, 300, "now()", {"handler": {"name": "bench.noop"}})
    figs = await anatomy.lifecycle(db, 2, prepare or [], narrow=prepare is None, warm=1)
    n = 3 * anatomy.BATCH
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded' AND finished_at IS NOT NULL"
            " AND fence IS NOT NULL AND attempt = 1) AS succeeded, count(*) AS total,"
            " (SELECT count(*) FROM cronwell_attempts WHERE outcome = 'succeeded') AS attempts,"
            " (SELECT coalesce(sum(succeeded_total), 0) FROM cronwell_job_counters) AS counted"
            " FROM cronwell_occurrences"
        )
        row = await cur.fetchone() or {}
        if prepare is None:
            cur = await conn.execute("SELECT count(*) AS left FROM bench_queue")
            assert (await cur.fetchone() or {})["left"] == 0
    assert (row["succeeded"], row["total"]) == (n, n)
    with_attempts = anatomy.NO_ATTEMPT_ROW not in (prepare or [])
    assert row["attempts"] == (n if with_attempts else 0)
    counted = prepare is None or not any("counters" in p for p in prepare)
    assert row["counted"] == (n if counted else 0)
    assert all(figs[f"{step}_ms"] >= 0 for step in anatomy.STEPS)
    assert figs["backend_ms"] > 0
    assert figs["server_ms"] > 0
