"""Every query the dashboard sends plans with index scans on cronwell_occurrences and
cronwell_jobs: no sequential scan of either, no sort of a large part of either (issue 29:
every page <= 300 ms p99 at 100k jobs / 10M runs, EXPLAIN shows index scans only).

A plan-shape check, not a timing one, on a store large enough (20,000 jobs with specs of a
realistic size, 200,000 runs, analysed) that the planner scans a table when no index fits.
The plans are the ones a request gets (parameters as literals: PostgreSQL's custom plans)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from cronwell.store import ui
from cronwell.store._queries import q
from cronwell.store.db import Database

JOBS, RUNS_PER_JOB = 20_000, 10
TABLES = ("cronwell_occurrences", "cronwell_jobs")
SORT_MAX_ROWS = JOBS // 10
"""A sort of more rows than this (estimated) is a sort of a large part of a table."""

JOB_FILTERS = {"namespaces": None, "namespace": None, "pool": None, "text": None,
               "state": None, "labels": None, "after_ns": None, "after_name": None,
               "after_key": None, "limit": 51}  # fmt: skip
RUN_FILTERS = {"namespaces": None, "namespace": None, "name": None, "state": None,
               "pool": None, "since": None, "until": None, "after_at": None,
               "after_id": None, "limit": 51}  # fmt: skip
POOL_RUNS = RUN_FILTERS | {"pool": "pool-1"}
"""A page of every pool's runs is one of these per pool (runs.newest_first)."""


def _cases(job_id: str, key: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, query name, parameters) of every read a dashboard page sends to the large
    tables (partitions, processes and fences are a few rows each)."""
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for sort, name in ui.JOB_SORTS.items():
        after = {"after_ns": "team-3", "after_name": "job-3", "after_key": "2026-01-01T00:00Z"}
        cases += [
            (f"jobs {sort}", name, JOB_FILTERS),
            (f"jobs {sort} page 2", name, JOB_FILTERS | after),
            (f"jobs {sort} label", name, JOB_FILTERS | {"labels": '{"app": "app-7"}'}),
            (f"jobs {sort} namespace", name, JOB_FILTERS | {"namespace": "team-3"}),
        ]
        cases += [(f"jobs {sort} {s}", name, JOB_FILTERS | {"state": s}) for s in ui.JOB_STATES]
    cases += [
        # Every pool's runs: the pools, then each pool's page (runs.newest_first).
        ("runs: pools", "RunPools", {}),
        ("runs", "UiRunPage", POOL_RUNS),
        ("runs page 2", "UiRunPage",
         POOL_RUNS | {"after_at": "2026-01-01T00:00Z", "after_id": 5000}),
        ("runs job", "UiRunPage", RUN_FILTERS | {"namespace": "team-3", "name": "job-3"}),
        ("runs namespace", "UiRunPage", POOL_RUNS | {"namespace": "team-3"}),
        ("runs dead", "UiRunPage", POOL_RUNS | {"state": "dead"}),
        ("runs running", "UiRunPage", POOL_RUNS | {"state": "running"}),
        ("runs cancelled", "UiRunPage", RUN_FILTERS | {"state": "cancelled"}),
        ("cli runs", "RunsList", {"namespace": None, "name": None, "state": None,
                                  "pool": "pool-1", "limit": 50}),
        ("job", "UiJobGet", {"namespace": "team-3", "name": "job-3"}),
        ("job runs", "RunsListForJob", {"job_id": job_id, "state": None, "limit": 25}),
        ("job histogram", "UiJobLagHistogram",
         {"job_id": job_id, "window_seconds": 7 * 86400, "edges": [0.1, 1.0]}),
        ("dead", "UiDeadList", {"namespaces": None, "namespace": None, "name": None,
                                "limit": 50}),
        ("dead namespace", "UiDeadList", {"namespaces": None, "namespace": "team-3",
                                          "name": None, "limit": 50}),
        ("dead confirm", "DeadMatchCount", {"namespace": None, "name": None}),
        ("dead action", "UiDeadNamespace", {"key": key, "namespaces": None}),
        ("namespaces", "UiNamespaces", {}),
        ("status", "UiOccurrenceCounts", {}),
        ("forecast backlog", "QueueDepthByPool", {}),
    ]  # fmt: skip
    return cases


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def problems(
    plan: dict[str, Any], tables: tuple[str, ...] = TABLES, sorts: bool = True
) -> list[str]:
    """Sequential scans of `tables` and (`sorts`) sorts of more than SORT_MAX_ROWS rows."""
    found = []
    for node in _nodes(plan):
        kind = node["Node Type"]
        if kind == "Seq Scan" and node.get("Relation Name") in tables:
            found.append(f"Seq Scan on {node['Relation Name']}")
        if sorts and kind == "Sort" and node["Plans"][0]["Plan Rows"] > SORT_MAX_ROWS:
            found.append(f"Sort of {node['Plans'][0]['Plan Rows']} rows by {node['Sort Key']}")
    return found


async def _seed(db: Database, jobs: int = JOBS, per_job: int = RUNS_PER_JOB) -> None:
    """`jobs` live jobs in 12 namespaces and 4 pools, `per_job` runs each over 10 days (1 %
    dead, the latest of 5 % of the jobs running or pending, the oldest of 5 % cancelled),
    their counters; analysed."""
    async with db.connection(deadline_seconds=300) as conn:  # seeding: not a dashboard call
        await conn.execute(
            "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition,"
            " next_run_at, suspended, consecutive_failures, labels)"
            " SELECT gen_random_uuid(), 'team-' || i %% 12, 'job-' || i,"
            " jsonb_build_object('schedule', '*/5 * * * *', 'target',"
            "  jsonb_build_object('log', jsonb_build_object('message', repeat('x', 400)))),"
            " 'h' || i,"
            " 'pool-' || i %% 4, i %% 16, now() + make_interval(secs => i), i %% 50 = 0,"
            " CASE WHEN i %% 100 = 3 THEN 3 ELSE 0 END,"
            " jsonb_build_object('app', 'app-' || i %% 40)"
            " FROM generate_series(1, %s) i",
            (jobs,),
        )
        await conn.execute(
            "INSERT INTO cronwell_job_counters (job_id, succeeded_total, last_successful_at)"
            " SELECT id, 1, now() - make_interval(secs => random() * 86400) FROM cronwell_jobs"
        )
        await conn.execute(
            "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
            " run_at, state, overlap, delivery, max_attempts, timeout_seconds, attempt,"
            " started_at, finished_at, lease_expires_at)"
            " SELECT j.id || ':' || k, j.id, j.pool, t, t, s, 'Skip', 'AtLeastOnce', 3, 60, 1,"
            " CASE WHEN s <> 'pending' THEN t END,"
            " CASE WHEN s IN ('succeeded', 'dead') THEN t + interval '1 second' END,"
            " CASE WHEN s = 'running' THEN now() + interval '1 minute' END"
            " FROM cronwell_jobs j, generate_series(1, %(per)s) k,"
            " LATERAL (SELECT now() - make_interval(secs => (%(per)s - k) * 864000.0 / %(per)s"
            "          + j.partition) AS t,"
            "  CASE WHEN k = %(per)s AND j.partition = 1 THEN 'running'"
            "       WHEN k = %(per)s AND j.partition = 2 THEN 'pending'"
            "       WHEN random() < 0.01 THEN 'dead'"
            "       WHEN k = 1 AND j.partition = 5 THEN 'cancelled' ELSE 'succeeded' END AS s) x",
            {"per": per_job},
        )
        await conn.execute("VACUUM ANALYZE cronwell_jobs")
        await conn.execute("VACUUM ANALYZE cronwell_job_counters")
        await conn.execute("VACUUM ANALYZE cronwell_occurrences")


async def _plan(conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any]) -> Any:
    cur = psycopg.AsyncClientCursor(conn)  # literals in the text: the custom plan
    await cur.execute(b"EXPLAIN (FORMAT JSON) " + q(name).encode(), params)
    row = await cur.fetchone()
    assert row is not None
    doc = row[0] if isinstance(row, tuple) else next(iter(row.values()))
    return (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]


async def test_dashboard_queries_use_indexes_only(db: Database) -> None:
    await _seed(db)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id::text AS job, idempotency_key AS key FROM cronwell_occurrences"
            " WHERE state = 'dead' LIMIT 1"
        )
        ids = await cur.fetchone()
        assert ids is not None
        bad = {}
        for label, name, params in _cases(ids["job"], ids["key"]):
            plan = await _plan(conn, name, params)
            # The one known exception: the last-run order is a top-N sort of the filtered
            # live jobs joined to their counters (docs/ui.md; an index on the counters would
            # cost every completion); its runs are still read by index, for its page only.
            exempt = name == "UiJobPageByLastRun"
            if found := problems(plan, ("cronwell_occurrences",) if exempt else TABLES,
                                 sorts=not exempt):  # fmt: skip
                bad[f"{label} ({name})"] = found
        # The forecast reads every live job by design (their ids and spec hashes, and every
        # p90 on a full refresh): the keys from an index of their own (0013: no scan or sort
        # of the jobs' rows), every p90 by a scan of the jobs, the p90s of jobs that finished
        # since the previous tick by the runs finished since; never a scan of the runs.
        since = datetime.now(UTC) + timedelta(minutes=1)  # a tick where few runs finished
        forecast = [("ForecastJobKeys", {"pool": None}), ("ForecastJobKeys", {"pool": "pool-1"}),
                    ("ForecastDurations", {"history": 20}),
                    ("ForecastDurationsSince", {"since": since, "history": 20})]  # fmt: skip
        for name, params in forecast:
            plan = await _plan(conn, name, params)
            full = name == "ForecastDurations"
            if found := problems(plan, TABLES[:1] if full else TABLES, sorts=not full):
                bad[f"forecast ({name}, {params})"] = found
    assert not bad, json.dumps(bad, indent=1)


async def test_last_run_order_reads_recent_runs_of_its_page_only(db: Database) -> None:
    """The jobs page sorted by last run reads each job's recent runs for the page's rows
    only: before, every live job read its last 20 runs before the sort kept a page (loops =
    the number of live jobs: the planner put the lateral reads below the sort at this size,
    2,000 jobs with 50 runs each)."""
    await _seed(db, 2000, 50)
    async with db.connection() as conn:
        cur = psycopg.AsyncClientCursor(conn)
        await cur.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + q("UiJobPageByLastRun").encode(), JOB_FILTERS
        )
        row = await cur.fetchone()
        assert row is not None
        doc = row[0] if isinstance(row, tuple) else next(iter(row.values()))
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    # On a partitioned history, each partition's scan (the relation names a partition).
    loops = [
        n["Actual Loops"]
        for n in _nodes(plan)
        if str(n.get("Relation Name", "")).startswith("cronwell_occurrences")
    ]
    assert loops and max(loops) <= JOB_FILTERS["limit"], loops


async def test_a_rare_state_page_reads_its_runs_only(db: Database) -> None:
    """/runs?state=cancelled when the cancelled runs are the oldest: the page reads those
    runs (cronwell_occurrences_rare), not every newer run filtered on its state (what
    walking cronwell_occurrences_recent did: 2.4 s at 10M runs in the bench)."""
    await _seed(db, 2000, 50)
    async with db.connection() as conn:
        cur = psycopg.AsyncClientCursor(conn)
        await cur.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + q("UiRunPage").encode(),
            RUN_FILTERS | {"state": "cancelled"},
        )
        row = await cur.fetchone()
        assert row is not None
        doc = row[0] if isinstance(row, tuple) else next(iter(row.values()))
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    assert plan["Actual Rows"] == RUN_FILTERS["limit"]
    removed = sum(
        n.get("Rows Removed by Filter", 0)
        for n in _nodes(plan)
        if str(n.get("Relation Name", "")).startswith("cronwell_occurrences")
    )
    assert removed <= RUN_FILTERS["limit"], removed
