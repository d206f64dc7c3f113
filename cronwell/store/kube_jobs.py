"""The Kubernetes Jobs of `job` targets as the store knows them: which Job an attempt runs
(for status.active) and which occurrences' outcomes are recorded (for deleting Jobs)."""

from __future__ import annotations

from collections.abc import Sequence

from cronwell.store.db import Database, row_class


@row_class
class KeyState:
    key: str
    state: str


async def record(db: Database, *, key: str, fence: int, job_name: str) -> bool:
    """Record the Job the attempt holding `fence` runs; False: the fence is stale (the
    occurrence was taken over, or cancelled by Replace)."""
    params = {"key": key, "fence": fence, "job_name": job_name}
    return bool(await db.execute("OccurrenceJobRecord", params))


async def states(db: Database, keys: Sequence[str]) -> dict[str, str]:
    """{key: state} of the occurrences with these keys (absent: no such row any more)."""
    rows = await db.rows(KeyState, "OccurrenceStatesByKey", {"keys": list(keys)})
    return {r.key: r.state for r in rows}
