"""Two scheduler processes; kill -9 one: its partitions are taken over, and no occurrence
is materialised twice or lost."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cronwell import partitions
from cronwell.store import leases
from cronwell.store import partitions as store_partitions
from cronwell.store.db import Database
from tests.helpers.procs import spawn, stop
from tests.helpers.wait import wait_for

from .helpers import db_now, make_job, occurrences

pytestmark = pytest.mark.slow


def _env(db_url: str, **extra: str) -> dict[str, str]:
    """Schedulers with 2 s partition leases, a 1 s horizon and fast ticks."""
    return {
        "CRONWELL_DATABASE_URL": db_url,
        "CRONWELL_PARTITION_LEASE_SECONDS": "2",
        "CRONWELL_HORIZON_SECONDS": "1",
        "CRONWELL_TICK_SECONDS": "0.2",
        "CRONWELL_LOG_LEVEL": "WARNING",
        **extra,
    }


async def _owners(db: Database) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in await leases.list_all(db):
        if r.live and r.holder is not None:
            counts[r.holder] += 1
    return dict(counts)


async def test_kill_minus_nine_a_scheduler(db: Database, db_url: str, tmp_path: Path) -> None:
    await partitions.set_count(db, 4)
    for i in range(40):
        await make_job(db, f"sec{i}", schedule="* * * * * *")
    env = _env(db_url, CRONWELL_PARTITIONS="4")
    a = spawn("scheduler", env=env, log=tmp_path / "a.log")
    b = spawn("scheduler", env=env, log=tmp_path / "b.log")
    try:

        async def split() -> bool:
            o = await _owners(db)
            return len(o) == 2 and sorted(o.values()) == [2, 2]

        await wait_for(split, 30, "two schedulers owning two partitions each", 0.1)
        await asyncio.sleep(1.5)
        os.kill(a.pid, signal.SIGKILL)
        killed_at = await db_now(db)
        start = time.monotonic()
        await wait_for(lambda: _one_owner(db), 30, "one scheduler owning all four", 0.1)
        took = time.monotonic() - start
        await asyncio.sleep(2.5)
    finally:
        stop(a)
        assert stop(b) == 0, (tmp_path / "b.log").read_text()
    assert took < 2 + 2 + 1.5, f"takeover took {took:.1f}s for a 2 s lease"
    await _each_instant_once(db, 40, killed_at + timedelta(seconds=1), "the kill")


async def _each_instant_once(db: Database, jobs: int, past: datetime, event: str) -> None:
    """Each of the `jobs` per-second jobs has its instants one second apart, each once,
    none missed, and went on past `past` (the instant just after `event`)."""
    occ = await occurrences(db)
    by_job: dict[str, list[datetime]] = defaultdict(list)
    for o in occ:
        by_job[o["name"]].append(o["scheduled_for"])
    assert len(by_job) == jobs
    for name, instants in by_job.items():
        assert len(instants) == len(set(instants)), f"{name}: duplicate instants"
        instants.sort()
        gaps = [b - a for a, b in itertools.pairwise(instants) if b - a != timedelta(seconds=1)]
        assert not gaps, f"{name}: lost instants around {gaps}"
        assert instants[-1] > past, f"{name} stopped at {event}"
    assert not [o for o in occ if o["state"] == "missed"]


async def _one_owner(db: Database) -> bool:
    o = await _owners(db)
    return len(o) == 1 and list(o.values()) == [4]


async def test_repartition_online_loses_and_repeats_nothing(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """`cronwell partitions set 7` while two schedulers materialise 30 per-second jobs at
    P=4: every job moves, the schedulers take the 7 partitions over, and every job's
    instants stay one second apart, each once, none missed."""
    await partitions.set_count(db, 4)
    for i in range(30):
        await make_job(db, f"sec{i}", schedule="* * * * * *")
    env = _env(db_url)
    a = spawn("scheduler", env=env, log=tmp_path / "a.log")
    b = spawn("scheduler", env=env, log=tmp_path / "b.log")
    try:

        async def owned(n: int) -> bool:
            o = await _owners(db)
            return len(o) == 2 and sum(o.values()) == n

        await wait_for(lambda: owned(4), 30, "four partitions owned by two", 0.1)
        await asyncio.sleep(1.5)
        changed_at = await db_now(db)
        old, moved = await partitions.set_count(db, 7)
        assert old == 4 and moved > 0
        await wait_for(lambda: owned(7), 30, "seven partitions owned by two", 0.1)
        await asyncio.sleep(2.5)
        # a scheduler configured with the old count refuses to start, saying why
        c = spawn("scheduler", "--partitions", "4", env=env, log=tmp_path / "c.log")
        assert c.wait(60) != 0
    finally:
        assert stop(a) == 0, (tmp_path / "a.log").read_text()
        assert stop(b) == 0, (tmp_path / "b.log").read_text()
    assert "cronwell partitions set 4" in (tmp_path / "c.log").read_text()
    assert "Traceback" not in (tmp_path / "c.log").read_text()
    rows = await store_partitions.job_page(db, after=uuid.UUID(int=0), limit=100)
    assert {r.partition for r in rows} <= set(range(7)) and len(rows) == 30
    await _each_instant_once(db, 30, changed_at + timedelta(seconds=2), "the change")
