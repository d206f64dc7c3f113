"""Store steps that tests take by hand, as a worker would."""

from __future__ import annotations

from cronwell import dispatch
from cronwell.store.db import Database


async def fail_dead(
    db: Database, key: str, fence: int, reason: str = "Failed", error: str = "boom"
) -> str:
    """Fail an attempt for good (no retry): the occurrence goes to the dead letters.
    Returns the state `dispatch.fail` reports."""
    return await dispatch.fail(
        db,
        key=key,
        fence=fence,
        next_state="dead",
        reason=reason,
        error=error,
        delay_seconds=0,
    )
