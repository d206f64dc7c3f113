"""Connection pool and the translation of psycopg errors into cronwell's.

A failing-over database must never wedge a process (invariant 9), so every connection
(pooled or the LISTEN one) is opened with the options `connection_options` adds, and
every checkout has a deadline: a call that gets no answer in time has its socket shut down
(it then fails at once, and the pool discards the connection) instead of waiting on a
primary that went silent. A connection that answers read-only (a standby, a demoted
primary) is discarded too, so the next one goes through the URL's hosts again and finds
the new primary (`target_session_attrs=read-write`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, LiteralString, TypeGuard, TypeVar, dataclass_transform

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import AsyncRowFactory, BaseRowFactory, DictRow, RowMaker, class_row, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from cronwell.errors import DatabaseError, DatabaseUnavailable, LockTimeout, UniqueViolation
from cronwell.store._queries import q

if TYPE_CHECKING:
    from psycopg._cursor_base import BaseCursor  # as psycopg.rows imports it

Conn = psycopg.AsyncConnection[DictRow]
R = TypeVar("R")
log = logging.getLogger(__name__)

CONNECTION_DEFAULTS: dict[str, str] = {
    # Per host (libpq's rule, psycopg follows it): a silent first host of a multi-host URL
    # costs these seconds, not the kernel's two minutes of SYN retries.
    "connect_timeout": "3",
    # Only a primary: a standby or a demoted primary is skipped at connect time.
    "target_session_attrs": "read-write",
    # A peer that vanished (host down, partition) is noticed by the kernel in ~20 s even
    # on an idle connection (the LISTEN one), and unacknowledged writes fail in 15 s.
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}
"""Options added to every connection unless the URL sets them (the URL always wins)."""

CLIENT_CHECK_SECONDS = 1.0
"""How often the server looks, while a statement runs, whether its client is still there
(client_connection_check_interval, db.sql): a client that dropped the connection at its
deadline has its statement ended within this."""
IDLE_MARGIN_SECONDS = 5.0
"""How long past a transaction's deadline the server waits on its client, idle in it,
before ending the session (db.sql, SessionBounds): a live client has dropped the
connection by then."""

RECONNECT_SECONDS = 4.0
"""How long the pool retries one lost connection (backoff 1 s, 2 s, ...) before it gives
up and a waiting client starts a new round at once: after an outage the first connection
comes within seconds of the database, not after psycopg_pool's 64 s backoff step."""


def connection_options(url: str, *, session_attrs: str = "read-write") -> dict[str, Any]:
    """CONNECTION_DEFAULTS less what `url` sets itself; passed as connect() keywords.
    `session_attrs`: the servers accepted (a read replica's pool accepts "any")."""
    given = _url_options(url)
    if given is None:
        return {}  # psycopg reports the malformed URL itself, at connect time
    defaults = CONNECTION_DEFAULTS | {"target_session_attrs": session_attrs}
    return {k: v for k, v in defaults.items() if k not in given}


def _url_options(url: str) -> dict[str, str] | None:
    """The options `url` sets itself; None when it does not parse."""
    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items()}
    except psycopg.ProgrammingError:
        return None


def first_line(e: BaseException) -> str:
    """An error's first line (psycopg's add hints on further lines), for one-line messages."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def redact(url: str) -> str:
    """The URL with its password hidden, for error messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def dataclass_row(cls: type[R]) -> BaseRowFactory[R]:
    """Rows as `cls` (a dataclass) instances: positionally when the columns are its fields
    in order, by name otherwise. psycopg's class_row builds a dict per row: 9 % of a worker's
    busy time in the 50k burst's profile, whose claims return their rows in field order."""
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    by_name = class_row(cls)

    def factory(cursor: BaseCursor[Any, Any]) -> RowMaker[R]:
        cols = tuple(c.name for c in cursor.description or ())
        if cols and cols == names[: len(cols)]:
            return lambda values: cls(*values)
        return by_name(cursor)

    return factory


@dataclass_transform(frozen_default=True)
def row_class(cls: type[R]) -> type[R]:
    """A row type: frozen to the type checker (PEP 681), hashed and compared as a frozen
    dataclass, built at a plain slots dataclass's speed. A frozen dataclass's `__init__`
    sets each field through `object.__setattr__` (its guard against assignment): 1.9 us for
    a claim's 19-field row against 0.22 us unguarded (Python 3.11), and a claim builds one
    per occurrence (its candidates come as arrays). mypy rejects an assignment to a field
    as it would for a frozen dataclass; at run time nothing checks it (dispatch.arrived
    completes a claimed row before anyone sees it)."""
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)


class Database:
    """A pool of async connections to one PostgreSQL, opened with a clear error."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_seconds: float = 10.0,
        deadline_seconds: float = 10.0,
        application_name: str = "cronwell",
        session_attrs: str = "read-write",
    ):
        """`deadline_seconds`: the longest a checkout may hold a connection (every call,
        a whole transaction included) before the connection is severed."""
        self.url = url
        self._timeout = connect_timeout_seconds
        self.deadline_seconds = deadline_seconds
        self.options = connection_options(url, session_attrs=session_attrs)
        client = CONNECTION_DEFAULTS | (_url_options(url) or {})
        self._session_bounds = {
            "idle_ms": _bound_ms(deadline_seconds),
            "check_ms": _ms(CLIENT_CHECK_SECONDS),
            "keepalives_idle": client["keepalives_idle"],
            "keepalives_interval": client["keepalives_interval"],
            "keepalives_count": client["keepalives_count"],
            "user_timeout_ms": client["tcp_user_timeout"],
        }
        """SessionBounds' values: the keepalives are the client's, as the URL or the
        defaults set them."""
        self.reads: Database = self
        """Where reads that tolerate staleness go (`cronwell runs`, the dashboard's pages, the
        forecast): a `replica.ReadDatabase` when a read URL is configured, else this one."""
        self.statements = 0
        """Statements sent (each one database round trip); benchmarks read it."""
        self.transactions = 0
        """Transactions opened (BEGIN and COMMIT are one more round trip each)."""
        self.pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=connect_timeout_seconds,
            kwargs={
                "row_factory": dict_row,
                "autocommit": True,
                "application_name": application_name,
                **self.options,
            },
            connection_class=psycopg.AsyncConnection[DictRow],
            configure=self._bound_session,
            reconnect_timeout=RECONNECT_SECONDS,
        )

    @property
    def primary(self) -> Database:
        """The primary's pool: for reads that describe the primary itself (its clock, its
        fence epoch, its standbys), whichever Database a caller was given."""
        return self

    async def open(self) -> None:
        try:
            await self.pool.open(wait=True, timeout=self._timeout)
        except PoolTimeout as e:
            with contextlib.suppress(Exception):
                await self.pool.close()
            reason = await self._probe()
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {redact(self.url)}: {reason}. "
                "Check --database-url / CRONWELL_DATABASE_URL, or unset it to use the "
                "embedded PostgreSQL."
            ) from e

    async def _probe(self) -> str:
        """One direct connection attempt, to tell the user *why* the pool could not open."""
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, **self.options)
            await conn.close()
            return "connections time out"
        except psycopg.Error as e:
            return first_line(e)

    async def close(self) -> None:
        await self.pool.close()

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(self, *, deadline_seconds: float | None = None) -> AsyncIterator[Conn]:
        """A pooled connection for one call or transaction, held at most the deadline
        (`deadline_seconds`, default the Database's): past it the connection is severed
        and the call fails with DatabaseUnavailable. A connection that answered
        read-only or lost its server is closed, never handed out again. A longer deadline
        than the Database's gets the server's bounds of its own for the checkout
        (DeadlineBounds), the session's set back after it."""
        async with self._checkout(deadline_seconds) as conn:
            if not self._longer(deadline_seconds):
                yield conn
                return
            await self._widen(conn, deadline_seconds, local=False)
            try:
                yield conn
            finally:
                await self._narrow(conn)

    def _longer(self, deadline_seconds: float | None) -> TypeGuard[float]:
        return deadline_seconds is not None and deadline_seconds > self.deadline_seconds

    async def _widen(self, conn: Conn, deadline_seconds: float, *, local: bool) -> None:
        bound = {"idle_ms": _bound_ms(deadline_seconds), "local": local}
        await _execute(conn, q("DeadlineBounds"), bound)

    async def _narrow(self, conn: Conn) -> None:
        """The session's bounds back on a connection widened for one checkout; one that
        cannot take them (cancelled, failing) is closed, never pooled with wider ones. A
        broken one is the pool's to discard (and its error the caller's to see)."""
        if conn.broken or conn.closed:
            return
        try:
            await _execute(
                conn,
                q("DeadlineBounds"),
                {"idle_ms": self._session_bounds["idle_ms"], "local": False},
            )
        except (psycopg.Error, asyncio.CancelledError):
            await conn.close()
            raise

    @contextlib.asynccontextmanager
    async def _checkout(self, deadline_seconds: float | None) -> AsyncIterator[Conn]:
        deadline = self.deadline_seconds if deadline_seconds is None else deadline_seconds
        with wrap_exceptions():
            async with self.pool.connection() as conn:
                with _deadline(conn, deadline) as severed:
                    try:
                        yield conn
                    except (psycopg.Error, DatabaseError) as e:
                        if severed:
                            raise DatabaseUnavailable(
                                f"no answer from the database within {deadline:g}s"
                                " (connection dropped)"
                            ) from e
                        cause = e if isinstance(e, psycopg.Error) else e.__cause__
                        if isinstance(cause, psycopg.Error) and _read_only(cause):
                            await conn.close()
                        raise

    async def _bound_session(self, conn: Conn) -> None:
        """A new connection's server-side bounds on a client that stops answering
        (SessionBounds): a paused or frozen process's transaction ends on the server too.
        Under the deadline like every call: the pool runs this outside any checkout, and a
        server gone silent after the handshake would otherwise hold the pool's connecting
        worker for ever (the pool then discards the severed connection and tries again)."""
        with _deadline(conn, self.deadline_seconds):
            await _execute(conn, q("SessionBounds"), self._session_bounds)

    @contextlib.asynccontextmanager
    async def transaction(self, *, deadline_seconds: float | None = None) -> AsyncIterator[Conn]:
        """A transaction held at most its deadline; one longer than the connection's gets
        the server's bounds of its own, for the transaction (DeadlineBounds)."""
        self.transactions += 1
        async with self._checkout(deadline_seconds) as conn, conn.transaction():
            if self._longer(deadline_seconds):
                await self._widen(conn, deadline_seconds, local=True)
            yield conn

    @contextlib.asynccontextmanager
    async def within(self, conn: Conn | None) -> AsyncIterator[Conn]:
        """`conn`, a transaction the caller holds, or else a transaction of its own: for
        statements that must share one, whoever began it."""
        if conn is not None:
            yield conn
            return
        async with self.transaction() as own:
            yield own

    async def rows(
        self,
        row: type[R],
        name: str,
        params: Mapping[str, Any] | None = None,
        conn: Conn | None = None,
    ) -> list[R]:
        """Run named query `name`; each row becomes a `row` (a dataclass named like its columns).

        Only the store's per-table modules call this; everyone else calls their functions."""
        self.statements += 1
        if conn is not None:
            return await _rows(conn, dataclass_row(row), q(name), params)
        async with self.connection() as c:
            return await _rows(c, dataclass_row(row), q(name), params)

    async def row(
        self,
        row: type[R],
        name: str,
        params: Mapping[str, Any] | None = None,
        conn: Conn | None = None,
    ) -> R | None:
        found = await self.rows(row, name, params, conn)
        return found[0] if found else None

    async def fetch(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> list[DictRow]:
        """Run named query `name` and return its rows as dicts (for columns read by name)."""
        self.statements += 1
        if conn is not None:
            return await _rows(conn, dict_row, q(name), params)
        async with self.connection() as c:
            return await _rows(c, dict_row, q(name), params)

    async def fetchone(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> DictRow | None:
        found = await self.fetch(name, params, conn)
        return found[0] if found else None

    async def scalar(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> Any:
        """The first column of the first row (None without rows): counts, clocks, flags."""
        found = await self.fetch(name, params, conn)
        return next(iter(found[0].values())) if found else None

    async def execute(
        self, name: str, params: Mapping[str, Any] | None = None, conn: Conn | None = None
    ) -> int:
        """Run named query `name`; return the affected row count."""
        self.statements += 1
        if conn is not None:
            return await _execute(conn, q(name), params)
        async with self.connection() as c:
            return await _execute(c, q(name), params)


@contextlib.contextmanager
def _deadline(conn: Conn, seconds: float) -> Iterator[list[bool]]:
    """`conn` severed (`_sever`) if the block still runs after `seconds`; the list yielded
    is non-empty once it was."""
    severed: list[bool] = []
    timer = asyncio.get_running_loop().call_later(seconds, _sever, conn, severed)
    try:
        yield severed
    finally:
        timer.cancel()


def _sever(conn: Conn, severed: list[bool]) -> None:
    """Shut the connection's socket down (not close: psycopg still owns the descriptor):
    a call waiting on it fails at once, with no cancel request sent to a silent server."""
    severed.append(True)
    log.warning(
        "database call past its deadline; dropping its connection",
        extra={"action": "db_deadline"},
    )
    with contextlib.suppress(OSError, psycopg.Error):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as s:
            s.shutdown(socket.SHUT_RDWR)


READ_ONLY_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})
"""read_only_sql_transaction, admin/crash shutdown, cannot_connect_now: the server is a
standby, a demoted primary or going down; the connection is no use to a writer."""


def _read_only(e: psycopg.Error) -> bool:
    text = str(e)
    return (
        e.sqlstate in READ_ONLY_STATES
        or "during recovery" in text
        or ("recovery is in progress" in text)
    )


@contextlib.contextmanager
def wrap_exceptions() -> Iterator[None]:
    """The one place psycopg's errors become cronwell's (as Procrastinate's `wrap_exceptions`).

    Unreachable server or pool, or a server that answers read-only (a standby, a demoted
    primary) → DatabaseUnavailable (loops retry it); a missing table → the `cronwell
    migrate` hint; a unique violation → UniqueViolation, which callers may expect."""
    try:
        yield
    except psycopg.Error as e:
        translated = _translate(e)
        if translated is None:
            raise
        raise translated from e


def _translate(e: psycopg.Error) -> DatabaseError | None:
    if isinstance(e, psycopg.errors.UniqueViolation):
        return UniqueViolation(e.diag.message_primary or str(e), e.diag.constraint_name)
    if isinstance(e, psycopg.errors.UndefinedTable):
        return DatabaseError(
            f"{e.diag.message_primary}: the schema is missing; run `cronwell migrate`"
        )
    if _read_only(e):
        return DatabaseUnavailable(
            f"the database answered read-only (a standby or a demoted primary): {e}"
        )
    if isinstance(e, PoolTimeout):
        return DatabaseUnavailable(f"no database connection available: {e}")
    if isinstance(e, psycopg.errors.LockNotAvailable):
        return LockTimeout(f"lock not granted in time: {e.diag.message_primary or e}")
    if isinstance(e, psycopg.OperationalError):
        return DatabaseUnavailable(f"database connection failed: {e}")
    return None


async def _rows(
    conn: Conn,
    factory: AsyncRowFactory[R],
    sql: LiteralString,
    params: Mapping[str, Any] | None,
) -> list[R]:
    with wrap_exceptions():
        async with conn.cursor(row_factory=factory) as cur:
            await cur.execute(sql, params)
            return await cur.fetchall() if cur.description else []


def _bound_ms(deadline_seconds: float) -> str:
    """The server's idle and statement bounds for a checkout with this deadline."""
    return _ms(deadline_seconds + IDLE_MARGIN_SECONDS)


def _ms(seconds: float) -> str:
    """A duration as set_config takes a time setting: whole milliseconds, as text."""
    return str(max(1, round(seconds * 1000)))


async def _execute(conn: Conn, sql: LiteralString, params: Mapping[str, Any] | None) -> int:
    with wrap_exceptions():
        cur = await conn.execute(sql, params)
        return cur.rowcount
