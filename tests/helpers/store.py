"""Store steps that tests take by hand, as a worker would."""

from __future__ import annotations

from cronwell import dispatch
from cronwell.store.db import Database


async def fail_dead(
    db: Database, key: str, fence: int, reason: str = "Failed", error: str = "boom"
) -> str:
    """Fail an attempt for good (no retry): the occurrence goes to the dead letters.
    Returns the state `dispatch.fail` reports."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s", (key,)
        )
        (row,) = await cur.fetchall()
    return await dispatch.fail(
        db,
        occurrence_id=row["id"],
        fence=fence,
        next_state="dead",
        reason=reason,
        error=error,
        delay_seconds=0,
    )


async def dead_letter(db: Database, namespace: str, name: str) -> str:
    """A job `namespace/name` (in a pool of its own) whose triggered occurrence died on its
    first attempt; the dead letter's key."""
    from cronwell import jobs
    from cronwell.models import ScheduledJobSpec

    pool = f"p-{namespace}-{name}"[:63]
    spec = {
        "schedule": "0 0 1 1 *",
        "pool": pool,
        "target": {"handler": {"name": "t-fail", "payload": {}}},
        "retry": {"maxAttempts": 2},
    }
    await jobs.apply_job(
        db, namespace=namespace, name=name, spec=ScheduledJobSpec.model_validate(spec)
    )
    key, created = await jobs.trigger_job(db, namespace=namespace, name=name)
    assert created
    (c,) = await dispatch.claim(db, pool=pool, worker_id="w1", limit=5, lease_seconds=60)
    assert c.idempotency_key == key
    assert await fail_dead(db, key, c.fence, "HTTP400", "answered 400") == "dead"
    return key
