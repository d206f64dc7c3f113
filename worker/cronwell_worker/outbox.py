"""The outbox relay: publishes the messages handlers wrote with `ctx.outbox()` in their
job's transaction, at least once.

Each pass locks a batch of unpublished rows (`FOR UPDATE SKIP LOCKED`, so relays in several
processes never publish the same row at the same time), publishes them in order, and marks
the published ones in the same transaction. A crash after publishing but before the commit
publishes those messages again: receivers deduplicate on the `Idempotency-Key` header,
`<occurrence key>:outbox:<outbox id>`, which is the same on every re-publication.

A message that fails is retried with exponential backoff on its `attempts` count; the wait
itself is kept by the relay process that saw the failure (another relay may retry sooner).
`attempts` and `last_error` show the history. Messages are never dropped.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cronwell.errors import EXPECTED_ERRORS, CronwellError
from cronwell.store import outbox
from cronwell.store.db import Database
from cronwell.supervise import RETRY_MAX_SECONDS, Backoff, wait_event

log = logging.getLogger("cronwell.outbox")


class RelaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CRONWELL_OUTBOX_", extra="ignore", frozen=True)

    batch_size: int = Field(100, ge=1, description="Messages locked and published per pass.")
    poll_seconds: float = Field(
        1.0, gt=0, description="Pause between passes when nothing is waiting."
    )
    publish_timeout_seconds: float = Field(
        10.0, gt=0, description="Per message; the batch's rows stay locked meanwhile."
    )
    initial_backoff_seconds: float = Field(1.0, ge=0, description="First retry delay.")
    max_backoff_seconds: float = Field(300.0, ge=0, description="Retry delay cap.")


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    key: str
    """The occurrence's idempotency key."""
    topic: str
    payload: Any
    created_at: datetime
    attempts: int
    """Publish attempts before this one."""

    @property
    def idempotency_key(self) -> str:
        """The same for every (re-)publication of this message."""
        return f"{self.key}:outbox:{self.id}"

    def document(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "idempotencyKey": self.idempotency_key,
            "occurrenceKey": self.key,
            "topic": self.topic,
            "payload": self.payload,
            "createdAt": self.created_at.isoformat(),
        }


Publisher = Callable[[OutboxMessage], Awaitable[None] | None]
"""Publishes one message or raises; a sync callable runs in a thread."""


class PublishError(CronwellError):
    """A message could not be published (it stays in the outbox and is retried)."""


class HttpPublisher:
    """POSTs each message as JSON with `Idempotency-Key`; any 2xx is success."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_seconds: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ):
        self.url = url
        self.headers = headers or {}
        self.timeout = timeout_seconds
        self._client = client or httpx.AsyncClient(follow_redirects=False)
        self._own_client = client is None

    async def __call__(self, m: OutboxMessage) -> None:
        try:
            resp = await self._client.post(
                self.url,
                content=json.dumps(m.document(), default=str),
                headers=self.headers
                | {
                    "Content-Type": "application/json",
                    "Idempotency-Key": m.idempotency_key,
                    "Cronwell-Outbox-Id": str(m.id),
                    "Cronwell-Topic": m.topic,
                },
                timeout=self.timeout,
            )
        except httpx.HTTPError as e:
            raise PublishError(f"POST {self.url}: {type(e).__name__}: {e}") from e
        if not 200 <= resp.status_code < 300:
            raise PublishError(f"POST {self.url} answered {resp.status_code}: {resp.text[:200]}")

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


def load_hook(spec: str) -> Publisher:
    """`package.module:function` -> the callable (for `--hook`)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise CronwellError(f"--hook {spec!r}: expected MODULE:FUNCTION")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise CronwellError(f"--hook {spec!r}: {e}") from None
    if not callable(fn):
        raise CronwellError(f"--hook {spec!r} is not callable")
    hook: Publisher = fn
    return hook


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def backoff(settings: RelaySettings, failures: int) -> float:
    """Delay before the next try of a message that failed `failures` times in a row."""
    return float(
        min(
            settings.max_backoff_seconds,
            settings.initial_backoff_seconds * 2 ** max(0, failures - 1),
        )
    )


class Relay:
    def __init__(self, db: Database, publish: Publisher, settings: RelaySettings | None = None):
        self.db = db
        self.publish = publish
        self.settings = settings or RelaySettings()
        self.published = 0
        self.failed = 0
        self._retry_at: dict[int, float] = {}
        """Message id -> monotonic time before which this relay leaves it alone."""
        self._stop = asyncio.Event()

    async def _call(self, m: OutboxMessage) -> None:
        timeout = self.settings.publish_timeout_seconds
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                if _is_async(self.publish):
                    await self.publish(m)  # type: ignore[misc]
                else:
                    await asyncio.to_thread(self.publish, m)
        except TimeoutError:
            if not deadline.expired():
                raise  # the publisher's own timeout, with its own message
            raise PublishError(f"not published within {timeout:g}s (publish timeout)") from None

    async def publish_once(self) -> tuple[int, int]:
        """One pass: lock a batch, publish it, mark it. Returns (published, failed)."""
        now = time.monotonic()
        for i in [i for i, t in self._retry_at.items() if t <= now]:
            del self._retry_at[i]
        ok: list[int] = []
        bad: list[tuple[int, str]] = []
        async with self.db.transaction() as conn:
            rows = await outbox.claim_batch(
                self.db, limit=self.settings.batch_size, skip=list(self._retry_at), conn=conn
            )
            for r in rows:
                m = OutboxMessage(
                    id=r.id,
                    key=r.idempotency_key,
                    topic=r.topic,
                    payload=r.payload,
                    created_at=r.created_at,
                    attempts=r.attempts,
                )
                try:
                    await self._call(m)
                except Exception as e:  # the user's publisher: any error is a failed publish
                    err = f"{type(e).__name__}: {e}" if not isinstance(e, PublishError) else str(e)
                    bad.append((m.id, err[:2000]))
                    # The row's attempt count (shared by all relays) sets the backoff.
                    delay = backoff(self.settings, m.attempts + 1)
                    self._retry_at[m.id] = time.monotonic() + delay
                    log.warning(
                        "outbox publish failed; will retry",
                        extra={
                            "action": "outbox_publish_failed",
                            "outbox_id": m.id,
                            "key": m.key,
                            "error": err[:300],
                            "retry_in": delay,
                        },
                    )
                else:
                    ok.append(m.id)
            if ok:
                await outbox.mark_published(self.db, ok, conn=conn)
            if bad:
                await outbox.mark_failed(self.db, bad, conn=conn)
        self.published += len(ok)
        self.failed += len(bad)
        return len(ok), len(bad)

    async def run(self) -> None:
        """Publish until stop()."""
        log.info("outbox relay started", extra={"action": "outbox_relay_start"})
        backoff = Backoff(first_seconds=0.5, max_seconds=RETRY_MAX_SECONDS)
        while not self._stop.is_set():
            delay = self.settings.poll_seconds
            try:
                published, failed = await self.publish_once()
                if published + failed >= self.settings.batch_size and published:
                    delay = 0
                backoff.success()
            except EXPECTED_ERRORS as e:  # anything else is a bug: it stops the process
                delay = backoff.failure()
                log.warning(
                    f"outbox relay pass failed; retrying in {delay:.1f}s: {e}",
                    extra={"action": "outbox_relay_failed"},
                )
            if delay > 0:
                await wait_event(self._stop, delay)
        log.info("outbox relay stopped", extra={"action": "outbox_relay_stop"})

    async def drain(self, timeout_seconds: float) -> int:
        """Publish until nothing is left that can be published now (or the timeout);
        returns how many were published."""
        deadline = time.monotonic() + timeout_seconds
        total = 0
        while time.monotonic() < deadline:
            published, failed = await self.publish_once()
            total += published
            if published == 0:
                if not failed and not self._retry_at:
                    break
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return total

    @property
    def backing_off(self) -> int:
        """Messages this relay failed to publish and will retry after their backoff."""
        return len(self._retry_at)

    def stop(self) -> None:
        self._stop.set()
