"""Listening for due batches (LISTEN cronwell_due): the claim loops sleep until a batch for
their pool lands instead of polling the table.

A LISTEN connection dies silently in a failover (peers learned it: River #1225, pg-boss
#850, Procrastinate #1425): it gets the pool's keepalives, and every `check_seconds` of
silence it is asked, under a deadline, whether it still listens on a primary."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Collection

import psycopg

from cronwell.errors import DatabaseUnavailable
from cronwell.store._queries import q
from cronwell.store.db import Database, wrap_exceptions


async def due_pools(
    db: Database, *, check_seconds: float = 10.0
) -> AsyncGenerator[Collection[str] | None, None]:
    """The pools each notification names, on one dedicated long-lived connection (outside
    the pool: it stays subscribed). Yields None first, once listening: anything notified
    before was missed. Raises DatabaseUnavailable when the connection is lost, stops
    listening, or does not answer its check within the database's deadline."""
    try:
        with wrap_exceptions():
            conn = await psycopg.AsyncConnection.connect(db.url, autocommit=True, **db.options)
            async with conn:
                await conn.execute(q("DueListen"))
                yield None
                while True:
                    async for n in conn.notifies(timeout=check_seconds):
                        with contextlib.suppress(ValueError):
                            yield json.loads(n.payload)
                    try:
                        async with asyncio.timeout(db.deadline_seconds):
                            cur = await conn.execute(q("DueListening"))
                            row = await cur.fetchone()
                    except TimeoutError:
                        raise DatabaseUnavailable(
                            f"listen connection did not answer within {db.deadline_seconds:g}s"
                        ) from None
                    if not (row and row[0]):
                        raise DatabaseUnavailable("listen connection no longer on a primary")
    except psycopg.Error as e:
        # Whatever else ends the subscription (a closed connection is an InterfaceError):
        # the worker polls and listens again, as it did before the listener moved here.
        raise DatabaseUnavailable(f"listen connection failed: {e}") from e
