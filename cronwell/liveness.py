"""Liveness means progress (invariant 9). A process is alive when its loops get their
database work done, not when its metrics port answers: a worker whose completion writer
waits on a silent primary while its heartbeats succeed on fresh connections would
otherwise renew the leases of attempts it can never record, for ever.

Each loop says when it starts waiting for the database (`waiting`) and when a call
succeeded (`progressed`); a loop that has waited longer than `stall_seconds` (a hung call,
or calls that keep failing) is stalled. Any stalled loop fails the liveness probe
(`/healthz`), so Kubernetes restarts the process; a stalled writer of the work it holds (a
worker's start and completion writers, a scheduler's materialisation) also stops it
renewing its leases, so that work is taken over, fenced. `stall_seconds` is a lease, and
never less than one call's deadline: a slow call on a busy machine is not a stall."""

from __future__ import annotations

import time
from collections.abc import Collection


def stall_seconds(lease_seconds: float, deadline_seconds: float) -> float:
    return max(lease_seconds, deadline_seconds)


class Liveness:
    def __init__(self, stall_seconds: float):
        self.stall_seconds = stall_seconds
        self._since: dict[str, float] = {}
        """Loop name -> when it began waiting for progress it has not made since."""

    def waiting(self, name: str) -> None:
        """`name` starts database work; it keeps the earliest start until it progresses."""
        self._since.setdefault(name, time.monotonic())

    def progressed(self, name: str) -> None:
        self._since.pop(name, None)

    def stalled(self, among: Collection[str] | None = None) -> list[str]:
        """The loops (of `among`; None: all) waiting longer than `stall_seconds`."""
        now = time.monotonic()
        return sorted(
            n
            for n, t in self._since.items()
            if (among is None or n in among) and now - t > self.stall_seconds
        )
