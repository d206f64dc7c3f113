"""Listening for due batches (LISTEN cronwell_due): the claim loops sleep until a batch for
their pool lands instead of polling the table."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Collection

import psycopg

from cronwell.errors import DatabaseUnavailable
from cronwell.store._queries import q
from cronwell.store.db import Database, wrap_exceptions


async def due_pools(db: Database) -> AsyncGenerator[Collection[str] | None, None]:
    """The pools each notification names, on one dedicated long-lived connection (outside
    the pool: it stays subscribed). Yields None first, once listening: anything notified
    before was missed. Raises DatabaseUnavailable when the connection is lost."""
    try:
        with wrap_exceptions():
            conn = await psycopg.AsyncConnection.connect(db.url, autocommit=True)
            async with conn:
                await conn.execute(q("DueListen"))
                yield None
                async for n in conn.notifies():
                    with contextlib.suppress(ValueError):
                        yield json.loads(n.payload)
    except psycopg.Error as e:
        # Whatever else ends the subscription (a closed connection is an InterfaceError):
        # the worker polls and listens again, as it did before the listener moved here.
        raise DatabaseUnavailable(f"listen connection failed: {e}") from e
