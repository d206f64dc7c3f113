"""Liveness means progress (invariant 9). A process is alive when its loops get their
database work done, not when its metrics port answers: a worker whose completion writer
waits on a silent primary while its heartbeats succeed on fresh connections would
otherwise renew the leases of attempts it can never record, for ever.

Each loop says when it starts waiting for the database (`waiting`) and when a call
succeeded (`progressed`); a loop that has waited longer than `stall_seconds` (a hung call,
or calls that keep failing) is stalled. A stalled process stops renewing its leases, so
its work is taken over, fenced, and its liveness probe (`/healthz`) fails, so Kubernetes
restarts it."""

from __future__ import annotations

import time


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

    def stalled(self, *, besides: str | None = None) -> list[str]:
        """The loops (other than `besides`) waiting longer than `stall_seconds`."""
        now = time.monotonic()
        return sorted(
            n for n, t in self._since.items() if n != besides and now - t > self.stall_seconds
        )
