"""History (occurrences, attempts) range-partitioned by nominal instant (issue 31).

`convert` turns a legacy store into the partitioned shape online, in resumable steps that each
check the catalog (docs/architecture.md, "History partitions"); `ensure_partitions` creates
missing partitions of a range (ahead of time, or for a backfill); `drop_expired` is the
store-wide retention by whole partitions. The shape is read from the catalog, never from the
numbered schema version."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg

from cronwell.errors import DatabaseError, LockTimeout
from cronwell.store.db import Conn, Database, row_class

log = logging.getLogger(__name__)

OCCURRENCES = "cronwell_occurrences"
ATTEMPTS = "cronwell_attempts"
DAY = 86400
AHEAD_SECONDS = 2 * DAY
AHEAD_PARTITIONS = 48
"""How far ahead maintenance keeps partitions: two days (a day never lacks its partition even
if the pruner stops for a day), but at most AHEAD_PARTITIONS of them: partitions narrower than
an hour (short retentions: tests, the soak) would otherwise number hundreds."""

LOCK_TIMEOUT = "2s"
LOCK_RETRIES = 30
"""A strong lock waits at most LOCK_TIMEOUT, then we back off and try again (a long query on
the table must not queue every writer behind our lock request)."""
DROP_LOCK_TIMEOUT = "100ms"
DROP_QUICK_TRIES = 5
"""A partition drop takes ACCESS EXCLUSIVE on the parent: every claim and completion queues
behind its request while it waits, so it first waits briefly, DROP_QUICK_TRIES times (the
retention bench saw a 10k burst's p99 go from 0.21 to 0.72 s with a 2 s wait at the burst's
instant). Then LOCK_TIMEOUT: an autovacuum of the partition holds a lock the drop needs and
is cancelled only once a waiter has waited `deadlock_timeout` (1 s), so short waits alone
never got past it (seen in the retention bench: the pass failed)."""

_STEP1_BUILD = {
    "cronwell_occurrences_id_instant": "HistoryIndexBuildOccId",
    "cronwell_occurrences_key_instant": "HistoryIndexBuildOccKey",
    "cronwell_attempts_one_success_instant": "HistoryIndexBuildAttSuccess",
}
"""Step 1's indexes (by name) and the query that builds each."""
_STEP1_DROP = {
    "cronwell_occurrences_id_instant": "HistoryIndexDropOccId",
    "cronwell_occurrences_key_instant": "HistoryIndexDropOccKey",
    "cronwell_attempts_one_success_instant": "HistoryIndexDropAttSuccess",
}
"""The query that drops each of step 1's indexes left INVALID by an interrupted build."""

T = TypeVar("T")


@row_class
class Shape:
    """relkind of each history table: 'p' partitioned, 'r' legacy, None missing."""

    occurrences: str | None
    attempts: str | None

    @property
    def partitioned(self) -> bool:
        return self.occurrences == "p"


@row_class
class Partition:
    """One partition; lo None = MINVALUE, lo and hi None = the DEFAULT partition."""

    parent: str
    name: str
    lo: datetime | None
    hi: datetime | None
    rows: int
    """reltuples: the planner's estimate (0 before the first ANALYZE)."""


@row_class
class _Checks:
    occurrences: bool | None
    attempts: bool | None


@dataclass
class Dropped:
    """What one retention pass did."""

    partitions: int = 0
    rows: int = 0
    """Estimated (reltuples) occurrences dropped."""
    postponed: int = 0
    """Expired partitions kept because they still hold unfinished rows."""


async def shape(db: Database, conn: Conn | None = None) -> Shape:
    """The history tables' current shape, from the catalog."""
    row = await db.row(Shape, "HistoryShape", conn=conn)
    return row or Shape(None, None)


async def _retrying(
    what: str,
    step: Callable[[], Awaitable[T]],
    timeout: str = LOCK_TIMEOUT,
    tries: int = LOCK_RETRIES,
) -> T:
    """Run `step` (a transaction that sets the lock timeout) until it gets its lock (the
    store reports a lock timeout as LockTimeout)."""
    for n in range(tries):
        try:
            return await step()
        except (psycopg.errors.LockNotAvailable, LockTimeout):
            log.info(f"{what}: lock busy, retrying", extra={"action": "history_lock_retry"})
            await asyncio.sleep(min(0.2 * 2**n, 5.0))
    raise LockTimeout(
        f"{what}: could not take the table lock within {timeout} in {tries} tries "
        "(a long transaction holds it): try again later (`cronwell migrate` resumes; the "
        "pruner's next pass retries a drop)"
    )


async def build_indexes(db: Database, conn: Conn) -> None:
    """Step 1: the unique indexes with the partition column, built CONCURRENTLY (`conn` is in
    autocommit, as pool connections are); an INVALID one left by an interrupted build is
    dropped and rebuilt."""
    if (await shape(db, conn)).partitioned:
        return
    invalid = {r["name"] for r in await db.fetch("HistoryInvalidIndexes", conn=conn)}
    for name, build in _STEP1_BUILD.items():
        if name in invalid:
            log.info(f"rebuilding the interrupted index {name}", extra={"action": "migrate"})
            await db.execute(_STEP1_DROP[name], conn=conn)
        await db.execute(build, conn=conn)


async def add_checks(
    db: Database, conn: Conn, *, fresh_cutover: datetime | None = None
) -> datetime:
    """Step 2: the cutover CHECKs (scheduled_for < C), added NOT VALID then validated (no
    writer waits); returns C. A row past C that slipped in before the CHECK fails the
    validation: the CHECKs are dropped and C recomputed. `fresh_cutover` is C for a store
    created by this very migration: nothing can be writing to it yet."""
    for _ in range(5):
        cutover: datetime = fresh_cutover or await db.scalar("HistoryCutover", conn=conn)
        state = await db.row(_Checks, "HistoryCheckState", conn=conn)
        if state is None or state.occurrences is None:

            async def add(cutover: datetime = cutover) -> None:
                async with conn.transaction():
                    await db.execute("HistoryLockTimeout", {"timeout": LOCK_TIMEOUT}, conn=conn)
                    await db.execute("HistoryCutoverSet", {"cutover": cutover}, conn=conn)
                    await db.execute("HistoryCheckAdd", conn=conn)

            await _retrying("adding the cutover CHECK", add)
            state = _Checks(False, False)
        try:
            if not state.occurrences:
                await db.execute("HistoryCheckValidateOcc", conn=conn)
            if not state.attempts:
                await db.execute("HistoryCheckValidateAtt", conn=conn)
            return cutover
        except psycopg.errors.CheckViolation:
            log.warning(
                "rows past the cutover arrived before its CHECK; choosing a later cutover",
                extra={"action": "migrate"},
            )

            async def drop() -> None:
                async with conn.transaction():
                    await db.execute("HistoryLockTimeout", {"timeout": LOCK_TIMEOUT}, conn=conn)
                    await db.execute("HistoryCheckDrop", conn=conn)

            await _retrying("dropping the cutover CHECK", drop)
    raise DatabaseError("could not validate the history cutover CHECK (rows keep arriving past it)")


async def switch(db: Database, conn: Conn, *, partition_seconds: int = DAY) -> None:
    """Step 3: the one short catalog-only transaction that makes the legacy tables partitions
    (and creates the first one after C, `partition_seconds` wide)."""

    async def step() -> None:
        async with conn.transaction():
            await db.execute("HistoryLockTimeout", {"timeout": LOCK_TIMEOUT}, conn=conn)
            await db.execute("HistoryWidthSet", {"seconds": partition_seconds}, conn=conn)
            await db.execute("HistorySwitch", conn=conn)

    await _retrying("switching history to partitions", step)


async def convert(
    db: Database,
    *,
    partition_seconds: int = DAY,
    deadline_seconds: float = 3600.0,
    fresh: bool = False,
) -> bool:
    """Partition the history online (idempotent, resumable; concurrent runs wait for each
    other); returns whether it switched now. Then creates the partitions of the coming days.
    One connection with a long deadline: an index build on a large table takes minutes.
    A `fresh` store (its schema created by this migration) cuts over at the start of the
    current partition, not days ahead: its history is in partitions of the chosen width
    from the first run (an existing store's cutover leaves time for writers and validation)."""
    switched = False
    if not (await shape(db)).partitioned:
        async with db.connection(deadline_seconds=deadline_seconds) as conn:
            await _convert_lock(db, conn)
            try:
                if not (await shape(db, conn)).partitioned:
                    log.info("partitioning history: building indexes", extra={"action": "migrate"})
                    await build_indexes(db, conn)
                    cutover = await add_checks(
                        db,
                        conn,
                        fresh_cutover=_cell(datetime.now(UTC), partition_seconds)
                        if fresh
                        else None,
                    )
                    log.info(
                        f"partitioning history: switching at {cutover.isoformat()}",
                        extra={"action": "migrate"},
                    )
                    await switch(db, conn, partition_seconds=partition_seconds)
                    switched = True
            finally:
                await db.execute("HistoryConvertUnlock", conn=conn)
    await ensure_ahead(db, partition_seconds=partition_seconds)
    return switched


async def _convert_lock(db: Database, conn: Conn) -> None:
    """Take the conversion's session lock, polling while another conversion holds it."""
    for _ in itertools.count():
        if await db.scalar("HistoryConvertLock", conn=conn):
            return
        await asyncio.sleep(0.5)


async def partitions(db: Database) -> list[Partition]:
    """Every partition of both history tables (empty for a legacy store)."""
    return await db.rows(Partition, "HistoryPartitionList")


def partition_name(parent: str, lo: datetime, hi: datetime) -> str:
    """`cronwell_occurrences_p20261204` for a UTC day, `..._p20261204_1300` otherwise."""
    lo = lo.astimezone(UTC)
    if hi - lo == timedelta(days=1) and lo.time() == datetime.min.time():
        return f"{parent}_p{lo:%Y%m%d}"
    return f"{parent}_p{lo:%Y%m%d_%H%M}"


def _cell(at: datetime, width: int) -> datetime:
    """The start of the `width`-second grid cell (aligned to UTC midnight) holding `at`."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + timedelta(seconds=(int((at - epoch).total_seconds()) // width) * width)


def _gaps(
    lo: datetime, hi: datetime, width: int, taken: list[tuple[datetime, datetime]]
) -> list[tuple[datetime, datetime]]:
    """Cells of a `width`-second grid (aligned to UTC midnight: width divides a day) covering
    [lo, hi), minus the ranges already taken: the partitions to create."""
    start = _cell(lo, width)
    out: list[tuple[datetime, datetime]] = []
    while start < hi:
        pieces = [(start, start + timedelta(seconds=width))]
        for a, b in taken:
            pieces = [p for s, e in pieces for p in ((s, min(e, a)), (max(s, b), e)) if p[0] < p[1]]
        out.extend(pieces)
        start += timedelta(seconds=width)
    return out


async def ensure_partitions(
    db: Database, lo: datetime, hi: datetime, *, partition_seconds: int = DAY
) -> int:
    """Create the missing partitions (both tables, same bounds) so every instant in [lo, hi)
    has one; returns how many ranges were created (0 on an unpartitioned store). Backfill and
    the materialiser call it before inserting instants outside the existing partitions."""
    parts = await partitions(db)
    low = datetime.min.replace(tzinfo=UTC)
    high = datetime.max.replace(tzinfo=UTC)
    taken = [
        (p.lo or low, p.hi or high)
        for p in parts
        if p.parent == OCCURRENCES and (p.lo, p.hi) != (None, None)
    ]
    if not taken:
        return 0
    created = 0
    for a, b in _gaps(lo, hi, partition_seconds, taken):
        for parent in (OCCURRENCES, ATTEMPTS):

            async def create(parent: str = parent, a: datetime = a, b: datetime = b) -> None:
                async with db.transaction() as conn:
                    await db.execute("HistoryLockTimeout", {"timeout": LOCK_TIMEOUT}, conn=conn)
                    await db.execute(
                        "HistoryPartitionArgs",
                        {"parent": parent, "name": partition_name(parent, a, b), "lo": a, "hi": b},
                        conn=conn,
                    )
                    await db.execute("HistoryPartitionCreate", conn=conn)

            await _retrying(f"creating a partition of {parent}", create)
        log.info(
            f"history partitions created for [{a.isoformat()}, {b.isoformat()})",
            extra={"action": "history_partition_create"},
        )
        created += 1
    return created


async def ensure_ahead(db: Database, *, partition_seconds: int = DAY) -> int:
    """Partitions from now to AHEAD_SECONDS (at most AHEAD_PARTITIONS) ahead (maintenance,
    scheduler start, migrate)."""
    now = datetime.now(UTC)
    ahead = min(AHEAD_SECONDS, AHEAD_PARTITIONS * partition_seconds)
    return await ensure_partitions(
        db, now, now + timedelta(seconds=ahead), partition_seconds=partition_seconds
    )


async def drop_expired(db: Database, *, retention_seconds: float) -> Dropped:
    """Drop every occurrences partition whose upper bound is older than now - retention, then
    its attempts partition of the same range (the legacy ones: the DEFAULT attempts), each in
    its own transaction (one parent lock at a time, in the writers' order: no deadlock with a
    completion); one that still holds an unfinished row is kept, with a warning naming the
    count. An attempts partition left by an interrupted pass goes on the next one."""
    res = Dropped()
    cutoff = datetime.now(UTC) - timedelta(seconds=retention_seconds)
    parts = await partitions(db)
    occ = [p for p in parts if p.parent == OCCURRENCES and p.hi is not None and p.hi <= cutoff]
    for p in occ:
        lo = p.lo or datetime.min.replace(tzinfo=UTC)
        unfinished = int(await db.scalar("HistoryPartitionUnfinished", {"lo": lo, "hi": p.hi}) or 0)
        if unfinished:
            res.postponed += 1
            log.warning(
                f"history partition {p.name} is past the retention but holds {unfinished} "
                "unfinished occurrences: kept until they finish",
                extra={"action": "history_partition_postponed", "unfinished": unfinished},
            )
            continue
        await _drop(db, p.name)
        res.partitions += 1
        res.rows += p.rows
        log.info(
            f"history partition {p.name} dropped (about {p.rows} occurrences)",
            extra={"action": "history_partition_drop", "partition": p.name, "rows": p.rows},
        )
    # Attempts partitions whose occurrences partition is gone (dropped above or by an earlier
    # pass interrupted between the two drops); the DEFAULT once no MINVALUE partition is left.
    left = {(p.lo, p.hi) for p in await partitions(db) if p.parent == OCCURRENCES}
    legacy_left = any(lo is None for lo, _ in left)
    for a in parts:
        if a.parent != ATTEMPTS:
            continue
        if a.hi is None and a.lo is None:
            orphan = not legacy_left
        else:
            orphan = a.hi is not None and a.hi <= cutoff and (a.lo, a.hi) not in left
        if orphan:
            await _drop(db, a.name)
    return res


async def _drop(db: Database, name: str) -> None:
    """Drops one partition in its own transaction, waiting at most DROP_LOCK_TIMEOUT a try."""

    async def drop(timeout: str) -> None:
        async with db.transaction() as conn:
            await db.execute("HistoryLockTimeout", {"timeout": timeout}, conn=conn)
            await db.execute(
                "HistoryPartitionArgs",
                {"parent": "", "name": name, "lo": "-infinity", "hi": "-infinity"},
                conn=conn,
            )
            await db.execute("HistoryPartitionDrop", conn=conn)

    what = f"dropping the history partition {name}"
    try:
        await _retrying(what, lambda: drop(DROP_LOCK_TIMEOUT), DROP_LOCK_TIMEOUT, DROP_QUICK_TRIES)
    except LockTimeout:
        await _retrying(what, lambda: drop(LOCK_TIMEOUT))
