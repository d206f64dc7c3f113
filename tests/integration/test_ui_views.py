"""The dashboard's runs filters (pool, time window), the job page's run columns, the status
page's figures (workers' load, backlog, retention, sizes) and the zone each instant
carries, against the real app and a real store; and the plans of the queries behind them."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from html import unescape as html_unescape
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell.store import processes, ui
from cronwell.store._queries import q
from cronwell.store.db import Database
from cronwell.ui.app import SECURITY_HEADERS, UiConfig, make_app
from tests.integration.helpers import make_job, seed_runs, sql


@pytest.fixture
async def client(db: Database) -> AsyncIterator[TestClient]:
    c = TestClient(TestServer(make_app(UiConfig(db=db))))
    await c.start_server()
    yield c
    await c.close()


def _jobs_listed(html: str) -> list[str]:
    return re.findall(r'<a href="/jobs/default/([^"]+)">', html)


async def test_runs_filter_by_pool_and_time_window(db: Database, client: TestClient) -> None:
    a = await make_job(db, "in-default", schedule="* * * * *")
    b = await make_job(db, "in-batch", schedule="* * * * *", pool="batch")
    await seed_runs(db, a.id, "default", [5, 90, 3 * 60])
    await seed_runs(db, b.id, "batch", [10, 2 * 24 * 60])

    async def listed(**params: str) -> list[str]:
        r = await client.get("/runs", params=params)
        assert r.status == 200, await r.text()
        return _jobs_listed(await r.text())

    assert sorted(await listed()) == ["in-batch"] * 2 + ["in-default"] * 3
    assert await listed(pool="batch") == ["in-batch", "in-batch"]
    assert await listed(window="1h") == ["in-default", "in-batch"]
    assert await listed(window="24h") == ["in-default", "in-batch", "in-default", "in-default"]
    assert await listed(window="1h", pool="batch") == ["in-batch"]
    now = datetime.now(UTC)
    since, until = (now - timedelta(minutes=100)).isoformat(), (now - timedelta(minutes=7))
    assert await listed(since=since, until=until.isoformat()) == ["in-batch", "in-default"]
    assert await listed(since=since) == ["in-default", "in-batch", "in-default"]
    before = ["in-batch", "in-default", "in-default", "in-batch"]
    assert await listed(until=until.isoformat()) == before
    # A Z suffix is UTC.
    z = (now - timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert await listed(since=z) == ["in-default", "in-batch"]


async def test_runs_window_pages_and_refreshes_with_its_filters(
    db: Database, client: TestClient
) -> None:
    """The next page and the live refresh carry the pool and window on."""
    job = await make_job(db, "paged", schedule="* * * * *", pool="batch")
    await seed_runs(db, job.id, "batch", [1, 2, 3, 4 * 60])
    params = {"pool": "batch", "window": "1h", "limit": "2"}
    html = await (await client.get("/runs", params=params)).text()
    assert _jobs_listed(html) == ["paged", "paged"]
    assert 'hx-get="/runs/fragment?pool=batch&amp;window=1h"' in html
    href = html_unescape(html.split('rel="next" href="', 1)[1].split('"', 1)[0])
    nxt = dict(parse_qsl(urlsplit(href).query))
    assert nxt["pool"] == "batch" and nxt["window"] == "1h"
    page2 = await (await client.get("/runs", params=nxt)).text()
    assert _jobs_listed(page2) == ["paged"] and 'rel="next"' not in page2
    frag = await (await client.get("/runs/fragment", params={"window": "1h"})).text()
    assert "<html" not in frag and _jobs_listed(frag) == ["paged"] * 3


@pytest.mark.parametrize(
    "query",
    [
        {"window": "2h"},
        {"since": "yesterday"},
        {"since": "2026-12-04T03:00:00"},  # no offset: a different instant for each viewer
        {"until": "2026-12-04"},
        {"since": "2026-12-04T03:00:00Z", "until": "2026-12-04T02:00:00Z"},
        {"since": "2026-12-04T03:00:00Z", "until": "2026-12-04T03:00:00Z"},
        {"window": "1h", "since": "2026-12-04T03:00:00Z"},
        {"pool": "p" * 300},
        {"state": "failed"},  # not a state of an occurrence
    ],
)
async def test_bad_runs_filters_are_400(client: TestClient, query: dict[str, str]) -> None:
    for path in ("/runs", "/runs/fragment"):
        r = await client.get(path, params=query)
        assert r.status == 400, (path, query)
        text = await r.text()
        assert "Traceback" not in text and "<h1>400</h1>" in text
        for name, value in SECURITY_HEADERS.items():
            assert r.headers[name] == value


async def test_runs_page_has_a_refresh_control_and_no_inline_script(client: TestClient) -> None:
    html = await (await client.get("/runs")).text()
    control = html.split('<select id="refresh" data-for="runs">', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'value="(\d+)"', control) == ["0", "2", "5", "15", "60"]
    assert '<option value="5" selected>' in control
    assert 'id="runs" data-poll="5000"' in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)  # CSP: script files only
    assert not re.search(r"<[^>]*\son[a-z]+=", html)


async def test_job_page_runs_show_jitter_lag_attempts_and_link_to_runs(
    db: Database, client: TestClient
) -> None:
    job = await make_job(db, "jittery", schedule="* * * * *", timeZone="Europe/Paris")
    await seed_runs(db, job.id, "default", [3], jitter=7.5)
    html = await (await client.get("/jobs/default/jittery")).text()
    head = html.split("<h2>Recent runs</h2>", 1)[1]
    assert re.findall(r"<th[^>]*>([^<]+)</th>", head.split("</thead>", 1)[0]) == [
        "Nominal time", "Outcome", "Attempts", "Fence", "Jitter", "Start lag", "Duration",
        "Error",
    ]  # fmt: skip
    row = head.split("<tbody>", 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[1:7] == ["succeeded", "1", "—", "7.5 s", "2.0 s", "3.0 s"], cells
    assert 'data-zone="Europe/Paris"' in cells[0]
    assert 'href="/runs?namespace=default&amp;job=jittery"' in html
    assert "the last 100 successful and 100 other finished runs" in html


async def test_instants_carry_the_job_zone_for_the_zone_switch(
    db: Database, client: TestClient
) -> None:
    job = await make_job(db, "zoned", schedule="0 3 * * *", timeZone="Asia/Tokyo")
    await seed_runs(db, job.id, "default", [3], state="dead")
    for path in ("/", "/runs", "/jobs/default/zoned", "/dead"):
        html = await (await client.get(path)).text()
        assert 'data-zone="Asia/Tokyo"' in html, path
        assert '<select id="zone-switch"' in html and 'value="job"' in html, path
        stamp = re.search(r'<time datetime="[^"]+" data-zone="Asia/Tokyo" title="([^"]+)"', html)
        assert stamp and re.fullmatch(r"Asia/Tokyo: .* JST · .* UTC", stamp.group(1)), path


async def test_status_shows_workers_load_backlog_retention_and_sizes(
    db: Database, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRONWELL_RETENTION_SECONDS", str(2 * 86400))
    for wid, pool, running in (("w-a", "default", 3), ("w-b", "default", 1), ("w-c", "batch", 8)):
        await processes.heartbeat(
            db,
            processes.ProcessEntry(
                id=wid, role="worker", pool=pool, hostname="node-1", pid=1, version="t",
                concurrency=8, running=running,
            ),
        )  # fmt: skip
    a = await make_job(db, "due-default", schedule="* * * * *")
    b = await make_job(db, "due-batch", schedule="* * * * *", pool="batch")
    await seed_runs(db, a.id, "default", [1, 2, 3], state="pending", due_seconds_ago=90)
    await seed_runs(db, a.id, "default", [-5], state="pending", due_seconds_ago=-300)  # not due
    await seed_runs(db, b.id, "batch", [4], state="pending", due_seconds_ago=600)
    await seed_runs(db, b.id, "batch", [60 * 24 * 3])  # finished 3 days ago
    r = await client.get("/status")
    assert r.status == 200
    html = await r.text()
    procs = html.split('<table class="processes">', 1)[1].split("</table>", 1)[0]
    w_a = procs.split("<td>w-a</td>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="running">3</td><td class="capacity">8</td><td class="load">37 %</td>' in w_a
    assert '<span class="pool-default">default: 2 worker(s), 4 in flight of 16</span>' in html
    assert '<span class="pool-batch">batch: 1 worker(s), 8 in flight of 8</span>' in html
    backlog = html.split('<table class="backlog">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(
        r'<tr><td>([^<]+)</td><td class="due">(\d+)</td><td>.*?</td>'
        r'<td class="late">([\d.]+) s</td></tr>',
        backlog,
    )
    assert [(p, n) for p, n, _ in rows] == [("batch", "1"), ("default", "3")]
    late = {p: float(s) for p, _, s in rows}
    assert 600 <= late["batch"] < 900 and 90 <= late["default"] < 600
    assert "2 d (172800 s)" in html
    oldest = html.split('class="oldest-finished">', 1)[1].split("</dd>", 1)[0]
    (kept,) = await sql(db, "SELECT min(finished_at) AS t FROM cronwell_occurrences")
    assert f'datetime="{kept["t"].isoformat()}"' in oldest
    sizes = dict(
        re.findall(r'<tr><td>(cronwell_\w+)</td><td class="bytes" data-bytes="(\d+)"', html)
    )
    # Partitioned: the sum over the partitions, which are not listed apart.
    (size,) = await sql(
        db,
        "SELECT sum(pg_total_relation_size(relid))::bigint AS n"
        " FROM pg_partition_tree('cronwell_occurrences')",
    )
    assert int(sizes["cronwell_occurrences"]) == size["n"] > 0
    assert not any(n.startswith("cronwell_occurrences_") for n in sizes), sizes
    assert {"cronwell_jobs", "cronwell_attempts", "cronwell_outbox"} <= set(sizes)


async def test_backlog_count_is_bounded(db: Database) -> None:
    job = await make_job(db, "many-due", schedule="* * * * *")
    await seed_runs(db, job.id, "default", [1, 2, 3, 4], state="pending", due_seconds_ago=30)
    (b,) = await ui.backlog(db, cap=3)
    assert (b.pool, b.due, b.more) == ("default", 3, True)
    (b,) = await ui.backlog(db, cap=4)
    assert (b.due, b.more) == (4, False)


async def test_status_without_backlog_or_processes(client: TestClient) -> None:
    html = await (await client.get("/status")).text()
    assert "None: every due occurrence has started." in html and "No processes." in html
    assert 'class="oldest-finished">—' in html


# Plans of the new queries on a store big enough that the planner scans a table when no
# index fits (a plan-shape check, not a timing one; the plans a request gets: parameters
# as literals, PostgreSQL's custom plans).

RUNS = {"namespaces": None, "namespace": None, "name": None, "state": None, "pool": None,
        "since": None, "until": None, "after_at": None, "after_id": None, "limit": 51}  # fmt: skip


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan] + [n for child in plan.get("Plans", []) for n in _nodes(child)]


async def _plan(db: Database, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = psycopg.AsyncClientCursor(conn)  # literals in the text: the custom plan
        await cur.execute(b"EXPLAIN (FORMAT JSON) " + q(name).encode(), params)
        row = await cur.fetchone()
    assert row is not None
    doc = next(iter(row.values())) if isinstance(row, dict) else row[0]
    return _nodes((json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"])


def _occurrence_reads(
    nodes: list[dict[str, Any]], parents: dict[str, str], empty: set[str]
) -> set[str]:
    """How the plan reads cronwell_occurrences: its indexes by name (a partition's index
    by its parent's, `parents`), or "Seq Scan"; reads of `empty` partitions aside (an
    empty partition is scanned, rightly)."""
    return {
        parents.get(n["Index Name"], n["Index Name"]) if "Index Name" in n else n["Node Type"]
        for n in nodes
        if (
            str(n.get("Relation Name", "")).startswith("cronwell_occurrences")
            or str(n.get("Index Name", "")).startswith("cronwell_occurrences")
        )
        and n.get("Relation Name", n.get("Index Name")) not in empty
    } - {"Bitmap Heap Scan"}


async def _partitions(db: Database) -> tuple[dict[str, str], set[str]]:
    """A partitioned history's index names -> their parent index's, and its empty
    partitions and their indexes (both empty on the unpartitioned shape)."""
    rows = await sql(
        db,
        "SELECT c.relname AS name, p.relname AS parent FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
        " WHERE c.relkind = 'i' AND p.relname LIKE 'cronwell_occurrences%%'",
    )
    parts = await sql(
        db,
        "SELECT c.relname AS name, EXISTS (SELECT FROM cronwell_occurrences o"
        "  WHERE o.tableoid = c.oid) AS used"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'cronwell_occurrences'::regclass"
        " UNION ALL SELECT ic.relname, EXISTS (SELECT FROM cronwell_occurrences o"
        "  WHERE o.tableoid = x.indrelid)"
        " FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid"
        " JOIN pg_class ic ON ic.oid = x.indexrelid"
        " WHERE i.inhparent = 'cronwell_occurrences'::regclass",
    )
    return {r["name"]: r["parent"] for r in rows}, {r["name"] for r in parts if not r["used"]}


SORT_MAX_ROWS = 1000
"""A sort of more rows than this (estimated, of 120,000) sorts a large part of the runs."""


POOL = "cronwell_occurrences_pool"
"""A pool's runs: its own index (0011)."""


async def test_new_queries_plan_index_range_scans(db: Database) -> None:
    """A pool's runs (with or without a window) are a range of cronwell_occurrences_pool,
    the pools a loose scan of it, a job's window one of
    cronwell_occurrences_job, the backlog probes of cronwell_occurrences_claim and the
    oldest finished run one of _finished: no sequential scan of the runs and no sort of
    many of them."""
    await sql(
        db,
        "INSERT INTO cronwell_jobs (id, namespace, name, spec, spec_hash, pool, partition)"
        " SELECT gen_random_uuid(), 'default', 'job-' || i, '{}', 'h',"
        "  CASE WHEN i = 1 THEN 'small' ELSE 'pool-' || i % 8 END, 0"
        " FROM generate_series(1, 2000) i",
    )
    await sql(
        db,
        "INSERT INTO cronwell_occurrences (idempotency_key, job_id, pool, scheduled_for,"
        " run_at, state, overlap, delivery, max_attempts, timeout_seconds, finished_at)"
        " SELECT j.id || ':' || k, j.id, j.pool, now() - make_interval(mins => k), now()"
        "  - make_interval(mins => k), CASE WHEN k = 1 THEN 'pending' ELSE 'succeeded' END,"
        "  'Allow', 'AtLeastOnce', 1, 60, CASE WHEN k > 1 THEN now() END"
        " FROM cronwell_jobs j, generate_series(1, 60) k",
    )
    await sql(db, "ANALYZE cronwell_occurrences")
    await sql(db, "ANALYZE cronwell_jobs")
    now = datetime.now(UTC)
    window = {"since": now - timedelta(hours=1), "until": now - timedelta(minutes=10)}
    cases = {
        "runs small pool": ("UiRunPage", RUNS | {"pool": "small"}, {POOL}),
        "runs small pool window": ("UiRunPage", RUNS | {"pool": "small"} | window, {POOL}),
        "runs pool": ("UiRunPage", RUNS | {"pool": "pool-3"}, {POOL}),
        "runs pool window": ("UiRunPage", RUNS | {"pool": "pool-3"} | window, {POOL}),
        "run pools": ("RunPools", {}, {POOL}),
        "runs job window": (
            "UiRunPage", RUNS | {"namespace": "default", "name": "job-7"} | window,
            {"cronwell_occurrences_job"},
        ),
        "backlog": ("UiBacklog", {"cap": 10_000}, {"cronwell_occurrences_claim"}),
        "oldest finished": ("UiOldestFinished", {}, {"cronwell_occurrences_finished"}),
    }  # fmt: skip
    bad = {}
    parents, empty = await _partitions(db)
    for label, (name, params, indexes) in cases.items():
        nodes = await _plan(db, name, params)
        reads = _occurrence_reads(nodes, parents, empty)
        sorts = [
            n["Sort Key"]
            for n in nodes
            if n["Node Type"] == "Sort" and n["Plans"][0]["Plan Rows"] > SORT_MAX_ROWS
        ]
        if not reads or not reads <= indexes or sorts:
            bad[label] = {"reads": sorted(reads), "sorts": sorts}
    assert not bad, json.dumps(bad, indent=1)
