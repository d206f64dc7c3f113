"""The pre-scaler's history on a real PostgreSQL: a leader writing the same pre-scale again
updates its row (facts once known stay known), and the dashboard reads each pool's newest
ones within a window, with the lead they achieved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from cronwell.store import prescales
from cronwell.store.db import Database

NOW = datetime.now(UTC).replace(microsecond=0)


def pre(minutes_ago: float, *, pool: str = "burst", **kw: object) -> prescales.PreScaleRecord:
    """A pre-scale of WorkerPool `pool` in namespace ops, its burst 30 s after it."""
    at = NOW - timedelta(minutes=minutes_ago)
    row = prescales.PreScaleRecord(
        namespace="ops",
        workerpool=pool,
        pool=pool,
        scaled_at=at,
        replicas=5,
        burst_at=at + timedelta(seconds=30),
        ready_at=None,
        landed_before_burst=None,
    )
    return replace(row, **kw)  # type: ignore[arg-type]


async def test_the_same_pre_scale_is_one_row_and_keeps_what_became_known(db: Database) -> None:
    first = pre(5)
    await prescales.record(db, first)
    ready = replace(
        first, ready_at=first.scaled_at + timedelta(seconds=12), landed_before_burst=True
    )
    await prescales.record(db, ready)
    # A new leader that only knows the status of before: Ready and landed stay known.
    await prescales.record(db, first)

    (row,) = await prescales.recent(db, within_seconds=3600, per_pool=20)

    assert (row.ready_at, row.landed_before_burst) == (ready.ready_at, True)
    assert row.lead_seconds == 18.0


async def test_recent_is_each_pools_newest_within_the_window(db: Database) -> None:
    for m in range(1, 5):
        await prescales.record(db, pre(m))
    late = pre(2, pool="other", landed_before_burst=False)
    await prescales.record(db, replace(late, ready_at=late.scaled_at + timedelta(seconds=40)))
    await prescales.record(db, pre(120, pool="other"))  # outside the window

    rows = await prescales.recent(db, within_seconds=3600, per_pool=3)

    assert [(r.pool, r.scaled_at) for r in rows] == [
        ("burst", NOW - timedelta(minutes=1)),
        ("burst", NOW - timedelta(minutes=2)),
        ("burst", NOW - timedelta(minutes=3)),
        ("other", NOW - timedelta(minutes=2)),
    ]
    assert rows[-1].lead_seconds == -10.0 and rows[-1].landed_before_burst is False
    assert rows[0].lead_seconds is None  # not seen Ready yet
    only = await prescales.recent(db, within_seconds=3 * 3600, per_pool=3, pool="other")
    assert [r.scaled_at for r in only] == [NOW - timedelta(minutes=m) for m in (2, 120)]
