"""Connection pool and the translation of psycopg errors into cronwell's."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any, LiteralString

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from cronwell.errors import DatabaseError, DatabaseUnavailable
from cronwell.store._queries import q

Conn = psycopg.AsyncConnection[DictRow]


def redact(url: str) -> str:
    """The URL with its password hidden, for error messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


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
        try:
            async with self.pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(f"database connection failed: {e}") from e
        except PoolTimeout as e:
            raise DatabaseUnavailable(f"no database connection available: {e}") from e

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        self.transactions += 1
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def fetch(
        self, name: str, params: dict[str, Any] | None = None, conn: Conn | None = None
    ) -> list[DictRow]:
        """Run named query `name` and return its rows (on `conn`, or a pooled connection)."""
        self.statements += 1
        if conn is not None:
            return await _fetch(conn, q(name), params)
        async with self.connection() as c:
            return await _fetch(c, q(name), params)

    async def fetchone(
        self, name: str, params: dict[str, Any] | None = None, conn: Conn | None = None
    ) -> DictRow | None:
        rows = await self.fetch(name, params, conn)
        return rows[0] if rows else None

    async def execute(
        self, name: str, params: dict[str, Any] | None = None, conn: Conn | None = None
    ) -> int:
        """Run named query `name`; return the affected row count."""
        self.statements += 1
        if conn is not None:
            return await _execute(conn, q(name), params)
        async with self.connection() as c:
            return await _execute(c, q(name), params)


async def _fetch(conn: Conn, sql: LiteralString, params: dict[str, Any] | None) -> list[DictRow]:
    try:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(f"database connection failed: {e}") from e
    except psycopg.errors.UndefinedTable as e:
        raise DatabaseError(
            f"{e.diag.message_primary}: the schema is missing; run `cronwell migrate`"
        ) from e


async def _execute(conn: Conn, sql: LiteralString, params: dict[str, Any] | None) -> int:
    try:
        cur = await conn.execute(sql, params)
        return cur.rowcount
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(f"database connection failed: {e}") from e
    except psycopg.errors.UndefinedTable as e:
        raise DatabaseError(
            f"{e.diag.message_primary}: the schema is missing; run `cronwell migrate`"
        ) from e
