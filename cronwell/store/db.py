"""Connection pool and the translation of psycopg errors into cronwell's."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import AsyncRowFactory, BaseRowFactory, DictRow, RowMaker, class_row, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from cronwell.errors import DatabaseError, DatabaseUnavailable, UniqueViolation
from cronwell.store._queries import q

if TYPE_CHECKING:
    from psycopg._cursor_base import BaseCursor  # as psycopg.rows imports it

Conn = psycopg.AsyncConnection[DictRow]
R = TypeVar("R")


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


class Database:
    """A pool of async connections to one PostgreSQL, opened with a clear error."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_seconds: float = 10.0,
        application_name: str = "cronwell",
    ):
        self.url = url
        self._timeout = connect_timeout_seconds
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
            },
            connection_class=psycopg.AsyncConnection[DictRow],
        )

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
            conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=3)
            await conn.close()
            return "connections time out"
        except psycopg.Error as e:
            return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    async def close(self) -> None:
        await self.pool.close()

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        with wrap_exceptions():
            async with self.pool.connection() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        self.transactions += 1
        async with self.connection() as conn, conn.transaction():
            yield conn

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
def wrap_exceptions() -> Iterator[None]:
    """The one place psycopg's errors become cronwell's (as Procrastinate's `wrap_exceptions`).

    Unreachable server or pool → DatabaseUnavailable (loops retry it); a missing table → the
    `cronwell migrate` hint; a unique violation → UniqueViolation, which callers may expect."""
    try:
        yield
    except psycopg.errors.UniqueViolation as e:
        raise UniqueViolation(e.diag.message_primary or str(e), e.diag.constraint_name) from e
    except psycopg.errors.UndefinedTable as e:
        raise DatabaseError(
            f"{e.diag.message_primary}: the schema is missing; run `cronwell migrate`"
        ) from e
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(f"database connection failed: {e}") from e
    except PoolTimeout as e:
        raise DatabaseUnavailable(f"no database connection available: {e}") from e


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


async def _execute(conn: Conn, sql: LiteralString, params: Mapping[str, Any] | None) -> int:
    with wrap_exceptions():
        cur = await conn.execute(sql, params)
        return cur.rowcount
