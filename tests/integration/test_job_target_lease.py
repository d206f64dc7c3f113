"""A `job` target's expired lease (its worker was killed) leaves the occurrence pending even
with no attempts left: the Job runs on without the worker, and the next claim adopts it and
records how it ended (kubejob.next_step never makes more Jobs than max_attempts). Other
targets keep dead-lettering as before. Seen on a real node: tests/node/test_job_target.py.
"""

from __future__ import annotations

from typing import Any

from cronwell.store import attempts as attempts_store
from cronwell.store import claims
from cronwell.store.db import Database

from .helpers import make_job
from .worker_helpers import FAR_FUTURE, attempts, occurrence, trigger

JOB = {
    "job": {
        "jobTemplate": {
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "localhost/report:1"}],
                    }
                }
            }
        }
    }
}


async def _claim_then_lose(db: Database, name: str, **spec: Any) -> dict[str, Any]:
    """One claim of a triggered occurrence, whose lease then runs out and is reaped."""
    await make_job(db, name, schedule=FAR_FUTURE, retry={"maxAttempts": 1}, **spec)
    key = await trigger(db, name)
    async with db.transaction() as conn:
        cur = await conn.execute(
            "SELECT id FROM cronwell_occurrences WHERE idempotency_key = %s", (key,)
        )
        oid = (await cur.fetchone())["id"]
        await claims.start(
            db, [oid], worker_id="killed", lease_seconds=60, row=claims.Started, conn=conn
        )
        await conn.execute(
            "UPDATE cronwell_occurrences SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (oid,),
        )
        await attempts_store.reap_leases(db, limit=100, conn=conn)
    return {**await occurrence(db, key), "id": oid}


async def test_a_job_target_whose_worker_was_lost_stays_pending_for_a_successor(
    db: Database,
) -> None:
    o = await _claim_then_lose(db, "report", target=JOB)
    assert (o["state"], o["reason"], o["attempt"], o["max_attempts"]) == (
        "pending",
        "LeaseExpired",
        1,
        1,
    )
    assert [a["outcome"] for a in await attempts(db, o["idempotency_key"])] == ["lease_expired"]
    # The successor's claim is attempt 2 of 1: it only adopts (kubejob.next_step).
    (started,) = await claims.start(
        db, [o["id"]], worker_id="successor", lease_seconds=60, row=claims.Started
    )
    assert (started.attempt, started.max_attempts) == (2, 1)


async def test_other_targets_and_at_most_once_still_dead_letter(db: Database) -> None:
    o = await _claim_then_lose(db, "ping", target={"log": {"message": "x"}})
    assert (o["state"], o["reason"]) == ("dead", "AttemptsExhausted")
    o = await _claim_then_lose(db, "once", target=JOB, delivery="AtMostOnce")
    assert (o["state"], o["reason"]) == ("dead", "Ambiguous")
