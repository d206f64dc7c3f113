"""The SDK for job code: `@cronwell.handler("name")` and the Context a handler receives.

A handler's effect is exactly-once when it is idempotent under the occurrence key, or when
it lands in cronwell's PostgreSQL through `ctx.transaction()`: the effect, its outbox
messages and the fenced completion then commit in one transaction, or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cronwell.errors import CronwellError, LeaseLost

if TYPE_CHECKING:
    from cronwell.dispatch import Claimed
    from cronwell.store.db import Conn, Database

Handler = Callable[["Context"], Any] | Callable[["Context"], Awaitable[Any]]
_REGISTRY: dict[str, Handler] = {}
_EVENTS = threading.Lock()  # guards the lazy creation of Context.cancelled


class StaleFence(CronwellError):
    """A fenced write carried a fence below one already accepted for the resource."""


def handler(name: str) -> Callable[[Handler], Handler]:
    """Register a job handler under `name` (the ScheduledJob's `target.handler.name`)."""

    def register(fn: Handler) -> Handler:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise CronwellError(f"handler {name!r} is registered twice")
        _REGISTRY[name] = fn
        return fn

    return register


def get_handler(name: str) -> Handler | None:
    return _REGISTRY.get(name)


def registered() -> list[str]:
    return sorted(_REGISTRY)


@dataclass
class Context:
    """What a running attempt knows about itself."""

    key: str
    """Idempotency key: `<job uid>:<nominal instant>`; send it downstream."""
    fence: int
    """Fencing token, strictly increasing per key: downstream rejects lower ones."""
    scheduled_for: datetime
    attempt: int
    namespace: str
    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    db: Database | None = None
    timeout_seconds: float | None = None
    """The attempt's own limit: the deadline of `ctx.transaction()` (the handler's work,
    not one of cronwell's short calls). None: the database's deadline."""
    completed_in_transaction: bool = False
    occurrence_id: int | None = None
    """The claimed occurrence's row id: `ctx.transaction()` completes it by id and fence."""
    start_instant: datetime | None = None
    """When the attempt started (database clock), if that start is not written yet (an
    AtLeastOnce attempt claimed ahead starts without a write): the completion records it."""
    _conn: Conn | None = None
    _cancel_flag: bool = field(default=False, repr=False)
    _cancel_event: threading.Event | None = field(default=None, repr=False)

    @classmethod
    def for_claim(cls, c: Claimed, db: Database) -> Context:
        """The context of a claimed attempt (the worker's, and tests acting as one)."""
        return cls(
            key=c.key,
            fence=c.fence,
            scheduled_for=c.scheduled_for,
            attempt=c.attempt,
            namespace=c.namespace,
            name=c.name,
            db=db,
            timeout_seconds=float(c.timeout_seconds),
            occurrence_id=c.id,
        )

    @property
    def cancelled(self) -> threading.Event:
        """Set when the lease is lost or the attempt is cancelled; sync handlers should poll
        it. Made on first use: most attempts never look (an Event per attempt was 3% of a
        worker's CPU in a burst)."""
        event = self._cancel_event
        if event is None:
            with _EVENTS:
                if self._cancel_event is None:
                    self._cancel_event = threading.Event()
                    if self._cancel_flag:
                        self._cancel_event.set()
                event = self._cancel_event
        return event

    def cancel(self) -> None:
        """Mark the attempt cancelled (thread-safe; wakes anyone waiting on `cancelled`)."""
        with _EVENTS:
            self._cancel_flag = True
            event = self._cancel_event
        if event is not None:
            event.set()

    def check_cancelled(self) -> None:
        """Raise LeaseLost if this attempt must stop (for long-running sync handlers)."""
        event = self._cancel_event  # once made, the Event is the truth (it may be cleared)
        if event.is_set() if event is not None else self._cancel_flag:
            raise LeaseLost(f"attempt of {self.key} (fence {self.fence}) was cancelled")

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        """A transaction on cronwell's database that also completes the occurrence, fenced.

        If another worker took the occurrence over, the completion matches nothing and
        the whole transaction (the handler's effect included) rolls back with LeaseLost.
        """
        if self.db is None or self.occurrence_id is None:
            raise CronwellError("ctx.transaction() needs the worker's database and claim")
        async with self.db.transaction(deadline_seconds=self.timeout_seconds) as conn:
            self._conn = conn
            try:
                yield conn
                self.check_cancelled()
                from cronwell import dispatch  # the SDK stays importable without the store

                done = await dispatch.succeed_in(
                    self.db, conn, [(self.occurrence_id, self.fence)], [self.start_instant]
                )
                if not done:
                    raise LeaseLost(f"{self.key}: fence {self.fence} is stale; rolled back")
            finally:
                self._conn = None
        self.completed_in_transaction = True

    async def outbox(self, topic: str, payload: dict[str, Any]) -> None:
        """Queue a message in the current `ctx.transaction()`; the relay publishes it."""
        if self._conn is None or self.db is None:
            raise CronwellError("ctx.outbox() must be called inside `async with ctx.transaction()`")
        from cronwell.store import outbox  # the SDK stays importable without the store

        await outbox.insert(self.db, key=self.key, topic=topic, payload=payload, conn=self._conn)

    async def fenced_write(self, resource: str, conn: Conn | None = None) -> None:
        """Claim `resource` at this attempt's fence, or raise StaleFence: a writer whose
        lease was taken over cannot overwrite its successor's work."""
        conn = conn or self._conn
        if conn is None or self.db is None:
            raise CronwellError("ctx.fenced_write() needs a connection or ctx.transaction()")
        from cronwell.store import fences  # the SDK stays importable without the store

        if not await fences.write(self.db, resource=resource, fence=self.fence, conn=conn):
            raise StaleFence(f"{resource}: fence {self.fence} is older than one already used")


async def sleep_or_cancel(ctx: Context, seconds: float) -> None:
    """Sleep that wakes early with LeaseLost when the attempt is cancelled."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        ctx.check_cancelled()
        await asyncio.sleep(min(left, 0.05))
    ctx.check_cancelled()
