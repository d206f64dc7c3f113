"""Pacing the operator's own API requests: one token bucket for the whole status writer
(a burst of 50k runs must not flood the API server), and per-job backoff after failed
writes (a job that keeps failing never blocks the jobs behind it)."""

from __future__ import annotations

import asyncio
import time

from cronwell.supervise import Backoff


class TokenBucket:
    """`rate` requests per second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


class JobBackoff:
    """Per-job retry times after failed status writes (monotonic seconds)."""

    def __init__(self, first_seconds: float = 1.0, max_seconds: float = 60.0):
        self.first, self.max = first_seconds, max_seconds
        self._jobs: dict[str, tuple[Backoff, float]] = {}

    def failed(self, uid: str, now: float) -> float:
        """Record a failure; seconds until the job is tried again."""
        b = self._jobs.get(uid, (Backoff(self.first, self.max), 0.0))[0]
        delay = b.failure()
        self._jobs[uid] = (b, now + delay)
        return delay

    def succeeded(self, uid: str) -> None:
        self._jobs.pop(uid, None)

    def waiting(self, now: float) -> set[str]:
        """Jobs not to be tried now."""
        return {uid for uid, (_, at) in self._jobs.items() if at > now}
