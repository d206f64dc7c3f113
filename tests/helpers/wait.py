"""Wait until something is true: one async poller for the store, and the operator-aware
form of `cronwell_operator.testing.wait_until` (the sync poller, shipped for users)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cronwell_operator.testing import OperatorProcess, wait_until

T = TypeVar("T")


async def wait_for(
    cond: Callable[[], Awaitable[T | None]],
    timeout: float = 15.0,
    what: str = "condition",
    interval: float = 0.05,
) -> T:
    """Poll `cond` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        v = await cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def eventually(
    op: OperatorProcess, predicate: Callable[[], T], what: str, timeout: float = 60
) -> T:
    """`wait_until` that fails at once if the operator died, and shows its log's tail."""
    try:
        return wait_until(predicate, timeout, what, check=op._alive)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log (tail) ---\n{op.output()[-3000:]}") from None
