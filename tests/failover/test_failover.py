"""cronwell through a failover of its database (invariants 2, 8 and 9), on real servers: a
primary and a streaming standby (tests/failover/replication.py), two `cronwell scheduler`
and two `cronwell worker` processes given both hosts in one URL, as in production, and a
downstream HTTP ledger that records every request (key, fence, attempt) and refuses a fence
lower than one it accepted for the key.

Each test: per-second crons run throughout, a burst of one-shots comes due, the fault
strikes during the burst, and afterwards the store and the ledger must show

- nothing lost: every expected occurrence succeeded, and its effect reached the ledger;
- no duplicate success in the store (one succeeded attempt per key);
- no fence value seen twice, for two keys, at the ledger or in the store;
- no success recorded under an attempt that did not run: the (key, fence) of every
  recorded success reached the ledger;
- fences per key never go backwards: the recorded success carries the highest fence the
  ledger saw for its key (a downstream that rejects stale fences accepts the re-run);
- effects of new claims resumed after the promotion or the return (the figure is printed;
  the bound here is generous, a wedge detector: the 5 s goal is measured, not asserted).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database, migrate
from tests.chaos.runner import Fleet, Ledger, iso
from tests.failover.replication import Node, Pair

pytestmark = [pytest.mark.slow, pytest.mark.failover]

CRONS = 8
"""Per-second jobs running throughout."""
BURST = 300
"""One-shots due in the same second, while the fault strikes."""
RESUMED_WITHIN_SECONDS = 20.0
"""Wedge detector only (the machine is shared and noisy): effects must resume this soon
after the database is back. The measured figure is printed."""


def spec(url: str, **fields: Any) -> ScheduledJobSpec:
    return ScheduledJobSpec.model_validate(
        {
            "timeZone": "UTC",
            "concurrencyPolicy": "Allow",
            "misfirePolicy": "RunAll",
            "retry": {"maxAttempts": 50, "initialDelaySeconds": 0.5, "maxDelaySeconds": 2},
            "timeoutSeconds": 10,
            "successfulJobsHistoryLimit": 100000,
            "target": {"http": {"url": url, "method": "POST", "connectTimeoutSeconds": 2}},
        }
        | fields
    )


@dataclass
class Result:
    expected: int
    resumed_after: float | None
    redelivered: int
    ledger_requests: int


async def scenario(
    tmp_path: Path,
    *,
    synchronous: bool,
    fault: Callable[[Pair], Awaitable[Node]],
    after_seconds: float = 20.0,
) -> Result:
    """Run the fleet through `fault` (which returns the primary afterwards and marks when
    the database was back) and check the invariants; the result carries the figures."""
    pair = await asyncio.to_thread(Pair, tmp_path / "pg", synchronous=synchronous)
    ledger = Ledger(rng=random.Random(1))
    server = await ledger.start()
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(pair.url, logs, partitions=4)
    try:
        url = f"http://127.0.0.1:{ledger.port}/effect"
        async with Database(pair.url, max_size=4) as db:
            await migrate(db, partitions=4)
            burst_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=12)
            ids: dict[str, str] = {}
            for i in range(CRONS):
                a = await jobs.apply_job(
                    db, namespace="fo", name=f"cron-{i}", spec=spec(url, schedule="* * * * * *")
                )
                ids[f"cron-{i}"] = str(a.id)
            for i in range(BURST):
                a = await jobs.apply_job(
                    db, namespace="fo", name=f"shot-{i}", spec=spec(url, runAt=iso(burst_at))
                )
                ids[f"shot-{i}"] = str(a.id)
        t_start = time.time()
        fleet.add("scheduler", 2)
        fleet.add("worker", 2)
        await asyncio.sleep(max(0.0, burst_at.timestamp() - time.time()))
        primary = await fault(pair)
        back = time.time()
        await asyncio.sleep(after_seconds)
        t_end = time.time()
        lo = datetime.fromtimestamp(t_start + 3, UTC).replace(microsecond=0)
        hi = datetime.fromtimestamp(t_end - 3, UTC).replace(microsecond=0)
        expected = {f"{ids[f'shot-{i}']}:{iso(burst_at)}" for i in range(BURST)}
        t = lo
        while t <= hi:
            expected |= {f"{ids[f'cron-{i}']}:{iso(t)}" for i in range(CRONS)}
            t += timedelta(seconds=1)
        occ, succeeded = await _drain(primary.url, expected)
    finally:
        rcs = await asyncio.to_thread(fleet.stop_all)
        server.close()
        await asyncio.to_thread(pair.close)

    # Nothing lost: every expected occurrence succeeded (RunAll, 50 attempts), with effect.
    not_done = sorted(k for k in expected if occ.get(k) != "succeeded")
    assert not not_done, f"{len(not_done)} of {len(expected)} not succeeded: {not_done[:5]}"
    reached = {r["key"] for r in ledger.requests}
    assert not expected - reached, f"effects never reached the ledger: {len(expected - reached)}"
    # No duplicate success in the store.
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, fence in succeeded:
        per_key[key].append(fence)
    doubled = {k: f for k, f in per_key.items() if len(f) > 1}
    assert not doubled, f"keys with two successes: {list(doubled.items())[:5]}"
    # No fence value for two keys (at the ledger, and among recorded successes).
    owner: dict[int, str] = {}
    reused = []
    for r in ledger.requests:
        if owner.setdefault(r["fence"], r["key"]) != r["key"]:
            reused.append((r["fence"], owner[r["fence"]], r["key"]))
    for key, fence in succeeded:
        if owner.setdefault(fence, key) != key:
            reused.append((fence, owner[fence], key))
    assert not reused, f"{len(reused)} fence values issued to two keys: {reused[:5]}"
    # No success recorded under an attempt that did not run.
    ran = {(r["key"], r["fence"]) for r in ledger.requests}
    phantom = [(k, f) for k, f in succeeded if (k, f) not in ran]
    assert not phantom, f"{len(phantom)} successes under attempts that never ran: {phantom[:5]}"
    # Fences never go backwards: the success holds the highest fence seen for its key.
    highest: dict[str, int] = {}
    for r in ledger.requests:
        highest[r["key"]] = max(highest.get(r["key"], r["fence"]), r["fence"])
    backwards = [(k, f, highest[k]) for k, f in succeeded if f < highest.get(k, f)]
    assert not backwards, f"{len(backwards)} keys whose fence went backwards: {backwards[:5]}"
    # No process crashed: each one rode the failover out (exit codes after our SIGTERM).
    assert all(rc in (0, -signal.SIGTERM) for rc in rcs.values()), rcs

    # The first effect of a claim made after the return: a fence above every fence seen
    # before it (an attempt already in flight at the fault does not count).
    old = max((r["fence"] for r in ledger.requests if r["t"] < back), default=0)
    after = sorted(r["t"] for r in ledger.requests if r["t"] >= back and r["fence"] > old)
    resumed = after[0] - back if after else None
    redelivered = sum(max(0, n - 1) for n in _counts(ledger.requests).values())
    print(
        f"\nfailover: {len(expected)} expected, first effect of a new claim "
        f"{resumed if resumed is None else round(resumed, 2)} s after the database was back, "
        f"{redelivered} redeliveries, {len(ledger.requests)} ledger requests"
    )
    assert resumed is not None and resumed <= RESUMED_WITHIN_SECONDS, resumed
    return Result(len(expected), resumed, redelivered, len(ledger.requests))


def _counts(requests: list[dict[str, Any]]) -> dict[str, int]:
    n: dict[str, int] = defaultdict(int)
    for r in requests:
        n[r["key"]] += 1
    return n


async def _drain(url: str, expected: set[str]) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """Wait (at most 90 s) until every expected occurrence has ended; the states of the
    expected keys and the (key, fence) of every recorded success."""
    deadline = time.monotonic() + 90
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        while True:
            cur = await conn.execute(
                "SELECT idempotency_key, state FROM cronwell_occurrences"
                " WHERE idempotency_key = ANY(%s)",
                (list(expected),),
            )
            occ = {r["idempotency_key"]: r["state"] for r in await cur.fetchall()}
            done = sum(s in ("succeeded", "dead", "skipped", "missed") for s in occ.values())
            if done >= len(expected) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        cur = await conn.execute(
            "SELECT idempotency_key, fence FROM cronwell_attempts WHERE outcome = 'succeeded'"
        )
        succeeded = [(r["idempotency_key"], r["fence"]) for r in await cur.fetchall()]
    return occ, succeeded


# -- the faults ---------------------------------------------------------------------------


async def crash_then_promote(pair: Pair) -> Node:
    """The primary's host dies mid-burst; the standby is promoted 3 s later."""
    await asyncio.sleep(0.5)
    await asyncio.to_thread(pair.h1.kill)
    await asyncio.sleep(3)
    await asyncio.to_thread(pair.h2.promote)
    return pair.h2


async def lagging_crash_then_promote(pair: Pair) -> Node:
    """Asynchronous replication, and the standby misses the primary's last seconds: its
    walsender stops 2 s before the burst's claims (reproduces fence reuse on old code)."""
    for pid in pair.h1.walsenders():
        os.kill(pid, signal.SIGSTOP)
    await asyncio.sleep(2.0)
    await asyncio.to_thread(pair.h1.kill)
    await asyncio.sleep(2)
    await asyncio.to_thread(pair.h2.promote)
    return pair.h2


async def silent_then_promote(pair: Pair) -> Node:
    """The primary goes silent (every process stopped: connections hang, no reset) and
    stays so; the standby is promoted 12 s later, as a failover manager would."""
    await asyncio.sleep(0.5)
    pair.h1.freeze()
    await asyncio.sleep(12)
    await asyncio.to_thread(pair.h2.promote)
    return pair.h2


async def outage(pair: Pair) -> Node:
    """A 90 s outage of the primary (crash, then restart on the same address)."""
    await asyncio.sleep(0.5)
    await asyncio.to_thread(pair.h1.kill)
    await asyncio.sleep(90)
    await asyncio.to_thread(pair.h1.relaunch)
    return pair.h1


async def demoted_back_read_only(pair: Pair) -> Node:
    """The primary crashes, the standby is promoted, and the old primary comes back as a
    read-only standby, still first in the URL."""
    await asyncio.sleep(0.5)
    await asyncio.to_thread(pair.h1.kill)
    await asyncio.sleep(2)
    await asyncio.to_thread(pair.h2.promote)
    pair.h1.follow(pair.h2)
    await asyncio.to_thread(pair.h1.relaunch)
    assert pair.h1.sql("SELECT pg_is_in_recovery()") == [(True,)]
    return pair.h2


@pytest.mark.timeout(500)
@pytest.mark.parametrize(
    ("fault", "synchronous"),
    [
        pytest.param(crash_then_promote, True, id="crash-then-promote-sync"),
        pytest.param(crash_then_promote, False, id="crash-then-promote-async"),
        pytest.param(lagging_crash_then_promote, False, id="async-standby-behind"),
        pytest.param(silent_then_promote, True, id="silent-primary-then-promote"),
        pytest.param(outage, False, id="ninety-second-outage"),
        pytest.param(demoted_back_read_only, False, id="demoted-primary-back-read-only"),
    ],
)
async def test_failover(
    tmp_path: Path, fault: Callable[[Pair], Awaitable[Node]], synchronous: bool
) -> None:
    await scenario(tmp_path, synchronous=synchronous, fault=fault)
