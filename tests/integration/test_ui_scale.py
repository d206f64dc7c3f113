"""What keeps the dashboard's pages cheap on a large store (issue 29's bench: bench/ui.py):
/status estimates the final states' counts instead of reading every run, and the forecast
view keeps one Forecaster across requests, as the operator does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell.store import ui
from cronwell.store.db import Database
from cronwell.ui.app import UiConfig, make_app
from tests.helpers.store import dead_letter
from tests.integration.helpers import make_job, seed_started_runs


@pytest.fixture
async def client(db: Database) -> AsyncIterator[TestClient]:
    c = TestClient(TestServer(make_app(UiConfig(db=db))))
    await c.start_server()
    yield c
    await c.close()


async def test_status_counts_estimate_final_states_on_a_large_store(db: Database) -> None:
    """Above `exact_below` occurrences the succeeded count is the planner's estimate (marked
    as one) and the dead and pending counts are exact; below it, every state is counted."""
    job = await make_job(db, "counted", schedule="0 0 1 1 *")
    await seed_started_runs(db, job.id, [(m, 0.1) for m in range(1, 41)])
    await dead_letter(db, "default", "died")
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
            " VALUES ('counted:pending', %s, 'default', now(), now(), 'pending', 'Skip',"
            " 'AtLeastOnce', 1, 60)",
            (job.id,),
        )
        await conn.execute("ANALYZE cronwell_occurrences")
    exact = await ui.occurrence_counts(db)
    assert {(c.state, c.n, c.estimate) for c in exact} == {
        ("succeeded", 40, False),
        ("dead", 1, False),
        ("pending", 1, False),
    }
    estimated = {c.state: c for c in await ui.occurrence_counts(db, exact_below=0)}
    assert (estimated["dead"].n, estimated["dead"].estimate) == (1, False)
    assert (estimated["pending"].n, estimated["pending"].estimate) == (1, False)
    assert estimated["succeeded"].estimate and estimated["succeeded"].n > 0


async def test_forecast_keeps_its_forecaster_across_requests(
    db: Database, client: TestClient
) -> None:
    """The second forecast reads only what changed: no spec is fetched again (before, each
    request built a Forecaster and fetched and derived every live job's spec)."""
    for i in range(3):
        await make_job(db, f"f{i}", schedule="* * * * *")
    sent = []
    for _ in range(2):
        before = db.statements
        r = await client.get("/forecast.json")
        assert r.status == 200
        assert sum(p["due_total"] for p in (await r.json())["pools"]) > 0
        sent.append(db.statements - before)
    assert sent[1] == sent[0] - 1, sent  # ForecastSpecs only the first time
