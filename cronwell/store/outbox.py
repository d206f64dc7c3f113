"""The transactional outbox (cronwell_outbox): messages written in a job's transaction and
published later by the relay, which locks, publishes and marks them in batches."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cronwell.store.db import Conn, Database, row_class


@row_class
class Message:
    """An unpublished outbox message, locked by the relay that read it."""

    id: int
    idempotency_key: str
    topic: str
    payload: Any
    created_at: datetime
    attempts: int


async def insert(
    db: Database, *, key: str, topic: str, payload: Mapping[str, Any], conn: Conn | None = None
) -> None:
    """Queue a message (in the caller's transaction: it exists only if the job's work does)."""
    await db.execute(
        "OutboxInsert", {"key": key, "topic": topic, "payload": json.dumps(payload)}, conn
    )


async def claim_batch(
    db: Database, *, limit: int, skip: Sequence[int], conn: Conn | None = None
) -> list[Message]:
    """Up to `limit` unpublished messages, oldest first, locked; ids in `skip` back off."""
    return await db.rows(Message, "OutboxClaimBatch", {"limit": limit, "skip": skip}, conn)


async def mark_published(db: Database, ids: Sequence[int], *, conn: Conn | None = None) -> None:
    """Mark relayed messages published."""
    await db.execute("OutboxPublishedMark", {"ids": ids}, conn)


async def mark_failed(
    db: Database, failures: Sequence[tuple[int, str]], *, conn: Conn | None = None
) -> None:
    """Record failed publishes, (id, error) each; the messages stay queued."""
    await db.execute(
        "OutboxFailedMark",
        {"ids": [i for i, _ in failures], "errors": [e for _, e in failures]},
        conn,
    )
