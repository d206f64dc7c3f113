"""The worker's instant timers (one event-loop timer per instant, shared by the attempts
claimed for it): every waiter goes at its instant, never before it, on asyncio's loop and
on uvloop (whose timers count whole milliseconds and may fire early), and cancelling one
waiter leaves the others of its instant waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from cronwell_worker.runtime import Instants

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def _run(loop: str, coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(coro())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_waiter_goes_at_its_instant_never_before(loop: str) -> None:
    early: list[float] = []
    woke: list[float] = []

    async def main() -> None:
        instants = Instants()
        base = time.monotonic() + 0.05
        # 120 instants, sub-millisecond apart (uvloop's whole milliseconds would round them
        # early), 20 waiters each, as a claim's attempts of one instant.
        dues = [base + i * 0.00037 for i in range(120)]

        async def wait(due: float) -> None:
            await instants.at(due)
            now = time.monotonic()
            woke.append(now - due)
            if now < due:
                early.append(due - now)

        await asyncio.gather(*(wait(d) for d in dues for _ in range(20)))

    _run(loop, main)
    assert len(woke) == 2400
    assert not early, f"{len(early)} waiters went before their instant, up to {max(early):.6f}s"
    assert max(woke) < 1.0, max(woke)  # each went (at its instant, a busy box allowing)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_cancelled_waiter_leaves_the_others_of_its_instant_waiting(loop: str) -> None:
    async def main() -> None:
        instants = Instants()
        due = time.monotonic() + 0.05
        futs = [instants.at(due) for _ in range(3)]
        futs[1].cancel()
        _, pending = await asyncio.wait([futs[0], futs[2]], timeout=5)
        assert not pending
        assert time.monotonic() >= due
        assert futs[1].cancelled() and futs[0].result() is None and futs[2].result() is None

    _run(loop, main)
