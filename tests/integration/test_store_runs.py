"""store.runs: the `runs` listings that `cronwell runs` and `kubectl cronwell runs` render."""

from __future__ import annotations

from typing import Any

from cronwell import jobs
from cronwell.store import runs, ui
from cronwell.store.db import Database

from .helpers import make_job, sql


async def test_runs_are_listed_by_name_or_job_uid_and_filtered_by_state(db: Database) -> None:
    job = await make_job(db, "listed", schedule="0 0 1 1 *")
    await make_job(db, "other", schedule="0 0 1 1 *")
    key, _ = await jobs.trigger_job(db, namespace="default", name="listed")
    await jobs.trigger_job(db, namespace="default", name="other")

    by_name = await runs.list_runs(db, namespace="default", name="listed", state=None, limit=10)
    assert [(r.name, r.idempotency_key, r.state, r.origin) for r in by_name] == [
        ("listed", key, "pending", "trigger")
    ]
    assert by_name[0].lag_seconds is None and by_name[0].fence is None
    assert await runs.list_for_job(db, job_id=job.id, state=None, limit=10) == by_name
    assert await runs.list_runs(db, namespace=None, name="listed", state="dead", limit=10) == []
    everything = await runs.list_runs(db, namespace=None, name=None, state=None, limit=10)
    assert {r.name for r in everything} >= {"listed", "other"}


async def test_lag_is_measured_from_the_jittered_instant_and_jitter_shown_apart(
    db: Database,
) -> None:
    """A job with 5 s of jitter that started 0.25 s after its jittered instant is 0.25 s late,
    not 5.25 s: `runs` shows jitter and lag as two columns."""
    await make_job(db, "jittered", schedule="0 0 1 1 *")
    key, _ = await jobs.trigger_job(db, namespace="default", name="jittered")
    await sql(
        db,
        "UPDATE cronwell_occurrences SET run_at = scheduled_for + interval '5 s', "
        "started_at = scheduled_for + interval '5.25 s' WHERE idempotency_key = %s",
        key,
    )
    (run,) = await runs.list_runs(db, namespace="default", name="jittered", state=None, limit=1)
    assert (float(run.jitter_seconds), float(run.lag_seconds or -1)) == (5.0, 0.25)


async def test_listings_of_every_pool_are_the_newest_runs_in_order(db: Database) -> None:
    """Without a pool or job, a listing is merged from each pool's newest (no index holds
    every run newest first, migration 0017): page after page, with ties of one instant in
    several pools, it is exactly what one ordered scan of all runs returns, filtered alike
    (namespace, a common state, a rare one, the viewer's namespaces)."""
    await sql(
        db,
        "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition)"
        " SELECT gen_random_uuid(), 'team-' || i % 2, 'job-' || i, '{}', 'h', 'p' || i % 3, 0"
        " FROM generate_series(1, 12) i",
    )
    await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
        " run_at, state, overlap, delivery, max_attempts, timeout_seconds)"
        " SELECT j.id || ':' || k, j.id, j.pool, t, t,"
        "  (ARRAY['succeeded', 'succeeded', 'dead', 'cancelled', 'running'])[1 + (k + i) % 5],"
        "  'Allow', 'AtLeastOnce', 1, 60"
        " FROM (SELECT *, row_number() OVER (ORDER BY name) AS i FROM cronwell_jobs) j,"
        "  generate_series(1, 9) k,"
        "  LATERAL (SELECT timestamptz '2026-01-01' + make_interval(mins => k / 2) AS t) x",
    )
    filters: list[dict[str, Any]] = [
        {},
        {"namespace": "team-1"},
        {"state": "succeeded"},
        {"state": "cancelled"},
        {"namespaces": ["team-0"]},
    ]
    for f in filters:
        expected = await sql(
            db,
            "SELECT o.id FROM cronwell_occurrences o JOIN cronwell_jobs j ON j.id = o.job_id"
            " WHERE (%s::text IS NULL OR j.namespace = %s) AND (%s::text IS NULL OR o.state = %s)"
            "  AND (%s::text[] IS NULL OR j.namespace = ANY(%s::text[]))"
            " ORDER BY o.scheduled_for DESC, o.id DESC",
            *[f.get(k) for k in ("namespace", "namespace", "state", "state")],
            f.get("namespaces"),
            f.get("namespaces"),
        )
        assert len(expected) > 14, f
        paged: list[int] = []
        after = None
        while page := await ui.run_page(
            db,
            namespaces=f.get("namespaces"),
            namespace=f.get("namespace"),
            name=None,
            state=f.get("state"),
            after=after,
            limit=7,
        ):
            paged += [r.id for r in page]
            after = (page[-1].scheduled_for, page[-1].id)
        assert paged == [r["id"] for r in expected], f
        if "namespaces" not in f:
            listed = await runs.list_runs(
                db, namespace=f.get("namespace"), name=None, state=f.get("state"), limit=11
            )
            assert [r.id for r in listed] == [r["id"] for r in expected[:11]], f
