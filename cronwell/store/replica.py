"""Reads off a streaming replica: the one place that decides whether a read that tolerates
staleness (`Database.reads`) is served by the replica or by the primary.

The replica serves while it answers and its replay lag is within a bound; otherwise the
read goes to the primary, with one log line when reads move and one when they come back,
never an error: a replica is an optimisation, the primary is always right. Writes and
transactions never reach the replica, so a write path handed this Database by mistake
still writes to the primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow

from cronwell.errors import DatabaseError, DatabaseUnavailable
from cronwell.store.db import Conn, Database, first_line, redact

R = TypeVar("R")
T = TypeVar("T")
log = logging.getLogger(__name__)

REPLICA_CHECKOUT_SECONDS = 3.0
"""How long a read waits for a replica connection before it goes to the primary (libpq's
per-host connect timeout, CONNECTION_DEFAULTS): a dead replica costs the read that finds
it this much, then reads skip it until the next check."""


class ReadDatabase(Database):
    """A pool on the replica at `url` for reads that tolerate staleness, falling back to
    `primary`. Whether the replica serves is checked at most every `check_seconds` (one
    ReplicaLag query): it must answer and be at most `max_lag_seconds` behind. A read that
    fails on the replica (it died since) is retried once on the primary.

    Only `rows`/`fetch` (and `row`, `fetchone`, `scalar` through them) are routed;
    `execute` and `transaction` always run on the primary; `connection()` is the
    replica's, without fallback (the store's read functions do not use it)."""

    def __init__(
        self,
        url: str,
        primary: Database,
        *,
        max_lag_seconds: float = 30.0,
        check_seconds: float = 5.0,
        max_size: int = 4,
        deadline_seconds: float = 10.0,
        application_name: str = "cronwell-reads",
    ):
        super().__init__(
            url,
            min_size=1,
            max_size=max_size,
            connect_timeout_seconds=REPLICA_CHECKOUT_SECONDS,
            deadline_seconds=deadline_seconds,
            application_name=application_name,
            session_attrs="any",
        )
        self._primary = primary
        self.max_lag_seconds = max_lag_seconds
        self.check_seconds = check_seconds
        self.why_not: str | None = None
        """Why reads go to the primary now (None: they go to the replica)."""
        self.fallback_reads = 0
        """Reads the primary served instead of the replica."""
        self._checked = -math.inf
        self._lock = asyncio.Lock()

    @property
    def primary(self) -> Database:
        return self._primary

    async def open(self) -> None:
        """Start connecting without waiting: a replica down at start-up sends reads to the
        primary, it does not stop the process."""
        logging.getLogger("psycopg.pool").addFilter(self._quiet)
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await super().close()
        logging.getLogger("psycopg.pool").removeFilter(self._quiet)

    def _quiet(self, record: logging.LogRecord) -> bool:
        """Drop the pool's own line per failed connection attempt to the replica (two lines
        each, every few seconds while it is down): `_verdict` says it once."""
        return not (isinstance(record.args, tuple) and record.args[:1] == (self.pool.name,))

    async def on_replica(self) -> bool:
        """Whether a read goes to the replica now; checks it when the last check is older
        than `check_seconds` (one check at a time, the others wait for its verdict)."""
        if time.monotonic() - self._checked >= self.check_seconds:
            async with self._lock:
                if time.monotonic() - self._checked >= self.check_seconds:
                    self._verdict(await self._check())
        return self.why_not is None

    async def _check(self) -> str | None:
        """Why the replica may not serve reads now (None: it may)."""
        try:
            found = await super().fetch("ReplicaLag")  # the replica itself, no routing
        except (DatabaseError, psycopg.Error) as e:
            return f"unreachable ({first_line(e)})"
        lag = found[0]["lag_seconds"] if found else None
        if lag is None:
            return "of unknown staleness (nothing replayed since it started)"
        if lag > self.max_lag_seconds:
            return f"{lag:.1f}s behind the primary (limit {self.max_lag_seconds:g}s)"
        return None

    def _verdict(self, why_not: str | None) -> None:
        """Record a check's verdict; log only when reads move (not at every check)."""
        self._checked = time.monotonic()
        where = redact(self.url)
        if why_not is not None and self.why_not is None:
            log.warning(
                f"reads moved to the primary: the read replica at {where} is {why_not}",
                extra={"action": "replica_fallback"},
            )
        elif why_not is None and self.why_not is not None:
            log.info(f"reads back on the read replica at {where}", extra={"action": "replica_back"})
        self.why_not = why_not

    async def _read(
        self, on_replica: Callable[[], Awaitable[T]], on_primary: Callable[[], Awaitable[T]]
    ) -> T:
        if await self.on_replica():
            try:
                return await on_replica()
            except DatabaseUnavailable as e:
                self._verdict(f"unreachable ({first_line(e)})")
        self.fallback_reads += 1
        return await on_primary()

    async def rows(
        self,
        row: type[R],
        name: str,
        params: Mapping[str, Any] | None = None,
        conn: Conn | None = None,
    ) -> list[R]:
        if conn is not None:
            return await Database.rows(self, row, name, params, conn)
        return await self._read(
            lambda: Database.rows(self, row, name, params),
            lambda: self._primary.rows(row, name, params),
        )

    async def fetch(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> list[DictRow]:
        if conn is not None:
            return await Database.fetch(self, name, params, conn)
        return await self._read(
            lambda: Database.fetch(self, name, params),
            lambda: self._primary.fetch(name, params),
        )

    async def execute(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> int:
        """On the primary (or on `conn`): nothing is written through the replica."""
        if conn is not None:
            return await Database.execute(self, name, params, conn)
        return await self._primary.execute(name, params)

    @contextlib.asynccontextmanager
    async def transaction(self, *, deadline_seconds: float | None = None) -> AsyncIterator[Conn]:
        """The primary's: anything in a transaction may write, and must see the primary."""
        async with self._primary.transaction(deadline_seconds=deadline_seconds) as conn:
            yield conn


@contextlib.asynccontextmanager
async def reads_from(db: Database, url: str | None, **options: Any) -> AsyncIterator[Database]:
    """`db`, its reads that tolerate staleness (`db.reads`) on the replica at `url` for the
    block (`options`: ReadDatabase's); `url` None: on `db` itself, as without a replica."""
    if url is None:
        yield db
        return
    async with ReadDatabase(url, db, **options) as reads:
        db.reads = reads
        try:
            yield db
        finally:
            db.reads = db
