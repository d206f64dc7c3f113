"""The dashboard against the real app and a real store: pages render data, filters and
keyset pagination work, every response carries the security headers, bad input is a 4xx
page, and no state-changing route is reachable without --allow-actions and the CSRF
token."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from html import unescape as html_unescape
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell import dispatch, jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import prescales, ui
from cronwell.store.db import Database
from cronwell.ui.app import CONFIG, CSRF_FIELD, SECURITY_HEADERS, UiConfig, make_app
from tests.helpers.store import dead_letter, fail_dead
from tests.integration.helpers import make_job, seed_started_runs, set_cursor, sql
from tests.integration.worker_helpers import attempts, handler_job, occurrence, trigger


async def _client(db: Database, *, allow_actions: bool = False) -> TestClient:
    client = TestClient(TestServer(make_app(UiConfig(db=db, allow_actions=allow_actions))))
    await client.start_server()
    return client


@pytest.fixture
async def client(db: Database) -> AsyncIterator[TestClient]:
    c = await _client(db)
    yield c
    await c.close()


def assert_secure(headers: object) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers[name] == value, name  # type: ignore[index]


async def test_a_silent_database_is_a_503_at_the_deadline(db_url: str) -> None:
    """The server process behind the dashboard's one connection stops (a frozen primary):
    a page answers 503 at the call's deadline instead of hanging, and the next request,
    on a new connection, works."""
    async with Database(db_url, max_size=1, deadline_seconds=1.0) as small:
        c = await _client(small)
        try:
            async with small.connection() as conn:
                cur = await conn.execute("SELECT pg_backend_pid() AS pid")
                row = await cur.fetchone()
                assert row is not None
            os.kill(int(row["pid"]), signal.SIGSTOP)
            try:
                async with asyncio.timeout(20):
                    r = await c.get("/")
            finally:
                os.kill(int(row["pid"]), signal.SIGCONT)
            assert r.status == 503
            text = await r.text()
            assert "did not answer" in text and "Traceback" not in text
            assert_secure(r.headers)
            assert (await c.get("/")).status == 200
        finally:
            await c.close()


async def test_jobs_page_lists_jobs(db: Database, client: TestClient) -> None:
    await make_job(db, "nightly-report", schedule="0 3 * * *", timeZone="Europe/Paris")
    r = await client.get("/")
    assert r.status == 200
    html = await r.text()
    assert "nightly-report" in html and "0 3 * * *" in html and "Europe/Paris" in html
    assert "<time datetime=" in html
    assert_secure(r.headers)


async def test_jobs_page_shows_last_result_and_strip(db: Database, client: TestClient) -> None:
    await _dead(db, "strip-job")
    html = await (await client.get("/", params={"text": "strip-job"})).text()
    assert 'class="cell state-dead"' in html
    assert '<span class="state state-dead">dead</span>' in html


async def test_jobs_filter_and_keyset_pagination(db: Database, client: TestClient) -> None:
    for i in range(5):
        await make_job(db, f"job-{i}", schedule="*/5 * * * *")
    await make_job(db, "other", schedule="*/5 * * * *")
    html = await (await client.get("/", params={"text": "job-"})).text()
    assert "job-0" in html and "other" not in html

    seen: list[str] = []
    params: dict[str, str] = {"text": "job-", "limit": "2"}
    for _ in range(4):
        html = await (await client.get("/", params=params)).text()
        seen += [f"job-{i}" for i in range(5) if f">job-{i}<" in html]
        if 'rel="next"' not in html:
            break
        last = seen[-1]
        params = {"text": "job-", "limit": "2", "after": f"default/{last}"}
    assert seen == [f"job-{i}" for i in range(5)]


async def test_page_size_is_clamped(db: Database, client: TestClient) -> None:
    for i in range(3):
        await make_job(db, f"clamp-{i}", schedule="*/5 * * * *")
    html = await (await client.get("/", params={"limit": "100000"})).text()
    assert all(f">clamp-{i}<" in html for i in range(3))
    html = await (await client.get("/", params={"limit": "0"})).text()
    assert ">clamp-0<" in html and ">clamp-1<" not in html


@pytest.mark.parametrize(
    "path",
    ["/?after=no-slash", "/?after=/x", "/?limit=abc", "/?namespace=" + "x" * 300],
)
async def test_bad_input_is_400(client: TestClient, path: str) -> None:
    r = await client.get(path)
    assert r.status == 400
    assert "Traceback" not in await r.text()
    assert_secure(r.headers)


async def test_unknown_path_is_404_with_headers(client: TestClient) -> None:
    r = await client.get("/no/such/page")
    assert r.status == 404
    assert_secure(r.headers)


async def test_robots_and_static(client: TestClient) -> None:
    r = await client.get("/robots.txt")
    assert r.status == 200 and "Disallow: /" in await r.text()
    assert_secure(r.headers)
    r = await client.get("/static/app.js")
    assert r.status == 200
    assert_secure(r.headers)


async def test_every_state_changing_route_is_guarded(db: Database) -> None:
    """Every non-GET route of the router (and a POST to any GET route) is refused in
    read-only mode, and without (or with a forged) CSRF token when actions are allowed."""
    read_only = await _client(db)
    actions = await _client(db, allow_actions=True)
    try:
        routes = {
            (route.method, info["path"] if "path" in info else info.get("formatter", "/"))
            for route in read_only.app.router.routes()  # type: ignore[union-attr]
            for info in [route.resource.get_info()]  # type: ignore[union-attr]
            if route.method not in {"GET", "HEAD"}
        } | {("POST", "/")}
        for method, path in routes:
            url = path.replace("{", "").replace("}", "")
            # Read-only refuses even a request carrying the valid token.
            token = read_only.app[CONFIG].csrf_token  # type: ignore[index]
            r = await read_only.request(method, url, data={CSRF_FIELD: token})
            assert r.status == 403, (method, path)
            r = await actions.request(method, url, data={})
            assert r.status == 403, (method, path)
            r = await actions.request(method, url, data={CSRF_FIELD: "forged"})
            assert r.status == 403, (method, path)
            assert_secure(r.headers)
    finally:
        await read_only.close()
        await actions.close()


async def _dead(db: Database, name: str) -> str:
    """A job whose triggered occurrence died on its first attempt; its key."""
    await handler_job(db, name, "t-fail-while", retry={"maxAttempts": 2})
    key = await trigger(db, name)
    (c,) = await dispatch.claim(db, pool="default", worker_id="w1", limit=5, lease_seconds=60)
    assert await fail_dead(db, key, c.fence, "HTTP400", "answered 400: <b>nope</b>") == "dead"
    return key


async def test_status_page(db: Database, client: TestClient) -> None:
    await _dead(db, "status-job")
    r = await client.get("/status")
    assert r.status == 200
    html = await r.text()
    assert "Commits:" in html and "Partitions (" in html
    assert "state-dead" in html
    assert_secure(r.headers)


async def test_dead_page_lists_escaped_and_read_only_has_no_form(
    db: Database, client: TestClient
) -> None:
    key = await _dead(db, "dead-job")
    html = await (await client.get("/dead")).text()
    assert key in html and "default/dead-job" in html
    assert "&lt;b&gt;nope&lt;/b&gt;" in html and "<b>nope" not in html
    assert 'method="post"' not in html
    html = await (await client.get("/dead", params={"job": "other"})).text()
    assert key not in html


async def test_replay_with_actions_and_token_changes_the_store(db: Database) -> None:
    key = await _dead(db, "replay-job")
    c = await _client(db, allow_actions=True)
    try:
        html = await (await c.get("/dead")).text()
        assert 'action="/dead/replay"' in html
        token = html.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        r = await c.post("/dead/replay", data={"key": key}, allow_redirects=False)
        assert r.status == 403
        assert (await occurrence(db, key))["state"] == "dead"
        r = await c.post(
            "/dead/replay", data={"key": key, CSRF_FIELD: token}, allow_redirects=False
        )
        assert r.status == 303 and r.headers["Location"] == "/dead?replayed=1"
        assert_secure(r.headers)
        assert (await occurrence(db, key))["state"] == "pending"
        r = await c.post("/dead/replay", data={"key": key, CSRF_FIELD: token})
        assert r.status == 404
        r = await c.post("/dead/replay", data={CSRF_FIELD: token})
        assert r.status == 400
    finally:
        await c.close()


async def test_job_page_shows_next_instants_in_zone_and_runs(
    db: Database, client: TestClient
) -> None:
    await make_job(db, "paris", schedule="30 2 * * *", timeZone="Europe/Paris")
    await _dead(db, "with-runs")
    r = await client.get("/jobs/default/paris")
    assert r.status == 200
    html = await r.text()
    assert "Next 10 instants" in html
    # 02:30 Paris is 00:30 or 01:30 UTC depending on the season; both columns shown.
    assert html.count("02:30:00 CE") >= 10
    assert ":30:00 UTC" in html
    html = await (await client.get("/jobs/default/with-runs")).text()
    assert "state-dead" in html and "answered 400" in html
    r = await client.get("/jobs/default/nope")
    assert r.status == 404 and "No such job" in await r.text()
    assert_secure(r.headers)


async def test_runs_page_filters_pages_and_fragment(db: Database, client: TestClient) -> None:
    for i in range(3):
        await _dead(db, f"runs-{i}")
    html = await (await client.get("/runs", params={"state": "dead"})).text()
    assert all(f"default/runs-{i}" in html for i in range(3))
    assert 'hx-get="/runs/fragment?state=dead"' in html and 'src="/static/htmx.min.js"' in html
    html = await (await client.get("/runs", params={"state": "succeeded"})).text()
    assert "default/runs-0" not in html

    seen: list[str] = []
    params = {"state": "dead", "limit": "1"}
    for _ in range(5):
        page = await (await client.get("/runs", params=params)).text()
        seen += [f"runs-{i}" for i in range(3) if f"default/runs-{i}<" in page]
        if 'rel="next"' not in page:
            break
        href = html_unescape(page.split('rel="next" href="', 1)[1].split('"', 1)[0])
        params = dict(parse_qsl(urlsplit(href).query))
    assert sorted(seen) == ["runs-0", "runs-1", "runs-2"] and len(seen) == 3

    r = await client.get("/runs/fragment", params={"job": "runs-1"})
    assert r.status == 200
    frag = await r.text()
    assert "<html" not in frag and "default/runs-1" in frag and "default/runs-0" not in frag
    assert_secure(r.headers)
    for bad in ("nope", "2026-01-01T00:00:00~x", "2026-01-01T00:00:00~1"):
        assert (await client.get("/runs", params={"after": bad})).status == 400


async def test_unexpected_error_is_a_plain_500(
    db: Database, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr("cronwell.store.ui.job_page", broken)
    r = await client.get("/")
    assert r.status == 500
    text = await r.text()
    assert "Internal error" in text and "secret detail" not in text and "Traceback" not in text
    assert_secure(r.headers)


async def test_cronwell_ui_serves_on_loopback_and_stops_on_sigterm(db_url: str) -> None:
    """The command as users run it: binds 127.0.0.1, serves, exits 0 on SIGTERM."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cronwell",
        "--database-url",
        db_url,
        "ui",
        "--port",
        str(port),
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/status") as r:
                        assert r.status == 200
                        assert r.headers["X-Content-Type-Options"] == "nosniff"
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("cronwell ui did not start")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _token(html: str) -> str:
    return html.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


async def _keys(db: Database) -> set[str]:
    return {r["idempotency_key"] for r in await sql(db, "SELECT * FROM cronwell_occurrences")}


async def test_discard_one_needs_actions_and_token_and_deletes_its_attempts(
    db: Database, client: TestClient
) -> None:
    gone, kept = await _dead(db, "discard-me"), await _dead(db, "keep-me")
    c = await _client(db, allow_actions=True)
    try:
        html = await (await c.get("/dead")).text()
        assert 'action="/dead/discard"' in html
        token = _token(html)
        r = await client.post("/dead/discard", data={"key": gone, CSRF_FIELD: token})
        assert r.status == 403  # read-only, even with the token
        r = await c.post("/dead/discard", data={"key": gone}, allow_redirects=False)
        assert r.status == 403
        assert await _keys(db) == {gone, kept}

        r = await c.post(
            "/dead/discard", data={"key": gone, CSRF_FIELD: token}, allow_redirects=False
        )
        assert r.status == 303 and r.headers["Location"] == "/dead?discarded=1"
        assert_secure(r.headers)
        assert await _keys(db) == {kept}
        assert await attempts(db, gone) == [] and await attempts(db, kept) != []
        html = await (await c.get(r.headers["Location"])).text()
        assert "1 dead letter(s) discarded." in html and gone not in html

        r = await c.post("/dead/discard", data={"key": gone, CSRF_FIELD: token})
        assert r.status == 404
        # From a filtered view, the redirect keeps the filter.
        html = await (await c.get("/dead", params={"job": "keep-me"})).text()
        assert '<input type="hidden" name="job" value="keep-me">' in html
        r = await c.post(
            "/dead/discard",
            data={"key": kept, "job": "keep-me", CSRF_FIELD: token},
            allow_redirects=False,
        )
        assert r.headers["Location"] == "/dead?job=keep-me&discarded=1"
        assert await _keys(db) == set()
        r = await c.post("/dead/discard", data={CSRF_FIELD: token})
        assert r.status == 400 and "Traceback" not in await r.text()
    finally:
        await c.close()


async def test_bulk_replay_and_discard_of_the_filter_with_confirmed_count(db: Database) -> None:
    a1, a2 = await _dead(db, "bulk-a"), await _dead(db, "bulk-a")
    b = await _dead(db, "bulk-b")
    amb = await _dead(db, "bulk-amb")
    await sql(
        db, "UPDATE cronwell_occurrences SET reason = 'Ambiguous' WHERE idempotency_key = %s", amb
    )
    c = await _client(db, allow_actions=True)
    try:
        html = await (await c.get("/dead", params={"job": "bulk-a"})).text()
        assert 'href="/dead/confirm?job=bulk-a&amp;action=replay"' in html
        token = _token(html)

        # Replay: the confirmation counts the replayable ones; Ambiguous ones are skipped.
        page = await (await c.get("/dead/confirm", params={"action": "replay"})).text()
        assert "<strong>3</strong> of 4 matching" in page and "1 are skipped" in page
        page = await (await c.get("/dead/confirm?action=replay&job=bulk-a")).text()
        assert "<strong>2</strong> of 2 matching" in page
        assert 'name="expect" value="2"' in page and 'name="job" value="bulk-a"' in page

        form = {"job": "bulk-a", "expect": "2"}
        r = await c.post("/dead/replay-all", data=form, allow_redirects=False)
        assert r.status == 403
        # A count that is no longer true changes nothing (409).
        r = await c.post("/dead/replay-all", data=form | {"expect": "3", CSRF_FIELD: token})
        assert r.status == 409 and "2 dead letter(s) match now" in await r.text()
        assert (await occurrence(db, a1))["state"] == "dead"
        r = await c.post("/dead/replay-all", data=form | {CSRF_FIELD: token}, allow_redirects=False)
        assert r.status == 303 and r.headers["Location"] == "/dead?job=bulk-a&replayed=2"
        assert [(await occurrence(db, k))["state"] for k in (a1, a2, b, amb)] == [
            "pending",
            "pending",
            "dead",
            "dead",
        ]

        # Discard every dead letter left (no filter): b and the Ambiguous one.
        page = await (await c.get("/dead/confirm", params={"action": "discard"})).text()
        assert "<strong>2</strong> matching dead letter(s) will be deleted" in page
        r = await c.post("/dead/discard-all", data={"expect": "1", CSRF_FIELD: token})
        assert r.status == 409 and "not the 1 confirmed" in await r.text()
        assert await _keys(db) == {a1, a2, b, amb}  # rolled back
        r = await c.post("/dead/discard-all", data={"expect": "2"}, allow_redirects=False)
        assert r.status == 403
        assert await _keys(db) == {a1, a2, b, amb}
        r = await c.post(
            "/dead/discard-all", data={"expect": "2", CSRF_FIELD: token}, allow_redirects=False
        )
        assert r.status == 303 and r.headers["Location"] == "/dead?discarded=2"
        assert await _keys(db) == {a1, a2}  # pending again: not dead letters any more
        assert await attempts(db, b) == [] and await attempts(db, amb) == []

        for path, data in [
            ("/dead/discard-all", {CSRF_FIELD: token}),
            ("/dead/discard-all", {"expect": "-1", CSRF_FIELD: token}),
            ("/dead/replay-all", {"expect": "x", CSRF_FIELD: token}),
            ("/dead/replay-all", {"expect": "0", "job": "j" * 300, CSRF_FIELD: token}),
        ]:
            r = await c.post(path, data=data)
            assert r.status == 400, (path, data)
            assert "Traceback" not in await r.text()
        assert (await c.get("/dead/confirm", params={"action": "drop"})).status == 400
        assert (await c.get("/dead", params={"replayed": "many"})).status == 400
    finally:
        await c.close()


async def test_bulk_confirmation_is_refused_read_only(client: TestClient) -> None:
    r = await client.get("/dead/confirm", params={"action": "discard"})
    assert r.status == 403
    assert_secure(r.headers)


PLAN = {"slo": "1", "concurrency_per_replica": "2", "min_replicas": "1", "max_replicas": "10"}


async def test_forecast_lists_each_minutes_burst_with_its_planned_replicas(
    db: Database, client: TestClient
) -> None:
    """12 jobs due every minute at :00 in pool p (1 s each, the default): with a 1 s SLO
    they need 6 slots (two waves), so 3 replicas of 2; a job of another pool not due
    within the hour does not show."""
    for i in range(12):
        await make_job(db, f"burst-{i}", schedule="* * * * *", pool="p")
    await make_job(db, "nightly", schedule="0 3 * * *", pool="q", suspend=True)
    r = await client.get("/forecast.json", params=PLAN)
    assert r.status == 200
    assert_secure(r.headers)
    data = await r.json()
    assert data["resolution"] == 1.0 and data["horizon_seconds"] == 3600
    assert data["pool_settings"]["concurrencyPerReplica"] == 2
    (p,) = data["pools"]
    assert p["pool"] == "p" and p["backlog"] == 0
    assert len(p["due"]) == len(p["concurrency"]) == len(p["replicas"]) == 3600
    start = datetime.fromisoformat(data["start"])
    assert start.microsecond == 0 and data["start_epoch"] == start.timestamp()
    # One burst of 12 at every :00 second within the hour, each needing 3 replicas.
    instants = [datetime.fromisoformat(b["time"]) for b in data["bursts"]]
    assert len(instants) in (60, 61) and all(t.second == 0 for t in instants)
    assert all(b["pool"] == "p" and b["due"] == 12 for b in data["bursts"])
    assert all(b["need"] == 3 and b["replicas"] == 3 for b in data["bursts"])
    first = (start + timedelta(seconds=59)).replace(second=0)  # the first :00 at or after start
    assert instants[0] == first
    assert p["due"][int((first - start).total_seconds())] == 12 and sum(p["due"]) == 12 * len(
        instants
    )
    assert max(p["concurrency"]) == 6 and max(p["replicas"]) == 3
    # The pre-scaler's plan: never below minReplicas; the next burst it scales for.
    assert min(p["replicas"]) >= 1 and p["replicas_now"] in (1, 3)
    assert p["next_burst"]["size"] == 12 and p["next_burst"]["replicas"] == 3

    r = await client.get("/forecast", params=PLAN)
    assert r.status == 200
    html = await r.text()
    assert "<h2>Pool p</h2>" in html and "Pool q" not in html
    row = (
        f'<tr><td><time datetime="{first.isoformat()}" title="UTC: {first.isoformat()}">'
        f"{first.isoformat()}</time></td>"
        "<td>p</td><td>12</td><td>3</td><td>3</td></tr>"
    )
    assert row in html
    assert html.count("<tr><td><time") >= 60 + 60  # the per-minute table and the bursts
    assert 'src="/static/uPlot.iife.min.js"' in html and 'src="/static/forecast.js"' in html
    block = html.split('<script type="application/json" id="forecast-data">', 1)[1]
    chart = json.loads(block.split("</script>", 1)[0])
    # The page was computed a moment after the JSON: compare over the seconds both cover.
    shift = int(chart["start_epoch"] - data["start_epoch"])
    assert 0 <= shift < 60 and "bursts" not in chart
    assert chart["pools"][0]["due"][: 3600 - shift] == p["due"][shift:]
    assert "<script>" not in html and "style=" not in html  # nothing inline (CSP)


async def test_forecast_pool_filter_defaults_and_empty(db: Database, client: TestClient) -> None:
    await make_job(db, "a", schedule="* * * * *", pool="a")
    await make_job(db, "b", schedule="*/2 * * * *", pool="b")
    data = await (await client.get("/forecast.json", params={"pool": "b"})).json()
    assert [p["pool"] for p in data["pools"]] == ["b"]
    assert data["pool_settings"] == {
        "startSLOSeconds": 5.0,
        "concurrencyPerReplica": 64,
        "minReplicas": 1,
        "maxReplicas": 10,
        "leadTimeSeconds": 60,
        "scaleDownDelaySeconds": 120,
    }
    assert {b["due"] for b in data["bursts"]} == {1} and len(data["bursts"]) in (30, 31)
    html = await (await client.get("/forecast", params={"pool": "none"})).text()
    assert "No live jobs in pool none due in the next hour" in html


async def _prescale(
    db: Database, pool: str, ago: timedelta, ready: float | None, landed: bool | None
) -> datetime:
    """A pre-scale of WorkerPool ops/`pool` `ago`, for a burst 60 s after it, its pods Ready
    `ready` s after it; when it scaled."""
    at = datetime.now(UTC).replace(microsecond=0) - ago
    ready_at = at + timedelta(seconds=ready) if ready is not None else None
    row = prescales.PreScaleRecord(
        "ops", pool, pool, at, 4, at + timedelta(seconds=60), ready_at, landed
    )
    await prescales.record(db, row)
    return at


async def test_forecast_shows_each_pools_recent_pre_scales(
    db: Database, client: TestClient
) -> None:
    """After the fact: when the pre-scaled pods were Ready against their burst, as the
    operator recorded it, the newest 20 per pool within the store-wide retention."""
    await _prescale(db, "p", timedelta(days=8), 10, True)  # beyond the retention (7 d)
    for m in range(30, 8, -1):  # 22 older ones, of which only the newest 17 show
        await _prescale(db, "p", timedelta(minutes=m), 10, True)
    late = await _prescale(db, "p", timedelta(minutes=3), 65.5, False)
    unknown = await _prescale(db, "p", timedelta(minutes=2), None, None)
    landed = await _prescale(db, "p", timedelta(minutes=1), 48, True)
    other = await _prescale(db, "q", timedelta(hours=2), 30, True)

    data = await (await client.get("/forecast.json")).json()
    shown = data["prescales"]
    assert [(p["pool"], p["scaled_at"]) for p in shown[:3]] == [
        ("p", landed.isoformat()),
        ("p", unknown.isoformat()),
        ("p", late.isoformat()),
    ]
    assert [p["pool"] for p in shown] == ["p"] * 20 + ["q"]
    assert shown[0] == {
        "namespace": "ops",
        "workerpool": "p",
        "pool": "p",
        "scaled_at": landed.isoformat(),
        "replicas": 4,
        "burst_at": (landed + timedelta(seconds=60)).isoformat(),
        "ready_at": (landed + timedelta(seconds=48)).isoformat(),
        "lead_seconds": 12.0,
        "landed_before_burst": True,
    }
    assert (shown[1]["ready_at"], shown[1]["lead_seconds"], shown[1]["landed_before_burst"]) == (
        None,
        None,
        None,
    )
    assert (shown[2]["lead_seconds"], shown[2]["landed_before_burst"]) == (-5.5, False)
    only = await (await client.get("/forecast.json", params={"pool": "q"})).json()
    assert [p["scaled_at"] for p in only["prescales"]] == [other.isoformat()]

    html = await (await client.get("/forecast")).text()
    assert "<h2>Recent pre-scales</h2>" in html
    assert "<h3>Pool p</h3>" in html and "<h3>Pool q</h3>" in html
    t, b = late.isoformat(), (late + timedelta(seconds=60)).isoformat()
    r = (late + timedelta(seconds=65.5)).isoformat()
    assert (
        f'<tr><td><time datetime="{t}" title="UTC: {t}">{t}</time></td><td>ops/p</td>'
        f'<td>4</td><td><time datetime="{b}" title="UTC: {b}">{b}</time></td>'
        f'<td><time datetime="{r}" title="UTC: {r}">{r}</time></td>'
        '<td class="lead">-5.5 s</td><td class="landed landed-no">no</td></tr>'
    ) in html
    assert '<td>—</td><td class="lead">—</td><td class="landed landed-unknown">unknown</td>' in html
    assert '<td class="lead">+12.0 s</td><td class="landed landed-yes">yes</td>' in html
    assert html.count('class="landed ') == 21
    empty = await (await client.get("/forecast", params={"pool": "none"})).text()
    assert "No pre-scales recorded for pool none in the last 7 d." in empty


async def _labelled(db: Database, name: str, labels: dict[str, str], **spec: Any) -> uuid.UUID:
    spec.setdefault("schedule", "*/5 * * * *")
    spec.setdefault("target", {"log": {"message": name}})
    applied = await jobs.apply_job(
        db,
        namespace="default",
        name=name,
        spec=ScheduledJobSpec.model_validate(spec),
        labels=labels,
    )
    return applied.id


def _names(html: str, candidates: list[str]) -> list[str]:
    """The candidates the page lists, in page order."""
    found = [(html.index(f">{n}<"), n) for n in candidates if f">{n}<" in html]
    return [n for _, n in sorted(found)]


async def _pages(client: TestClient, params: dict[str, str], names: list[str]) -> list[str]:
    """Every page of the jobs view from `params`, following its rel=next links."""
    seen: list[str] = []
    for _ in range(20):
        r = await client.get("/", params=params)
        assert r.status == 200, await r.text()
        page = await r.text()
        seen += _names(page, names)
        if 'rel="next"' not in page:
            return seen
        href = html_unescape(page.split('rel="next" href="', 1)[1].split('"', 1)[0])
        params = dict(parse_qsl(urlsplit(href).query))
    pytest.fail("no last page")


async def test_jobs_state_and_label_filters(db: Database, client: TestClient) -> None:
    await _labelled(db, "lab-a", {"team": "a", "tier": "1"})
    await _labelled(db, "lab-b", {"team": "b"})
    await _labelled(db, "lab-susp", {"team": "a"}, suspend=True)
    await _labelled(db, "lab-late", {})
    await set_cursor(db, "lab-late", "now() - interval '10 minutes'")
    await _dead(db, "lab-failing")
    names = ["lab-a", "lab-b", "lab-susp", "lab-late", "lab-failing"]

    async def listed(**params: str) -> list[str]:
        return sorted(_names(await (await client.get("/", params=params)).text(), names))

    assert await listed(state="suspended") == ["lab-susp"]
    assert await listed(state="active") == ["lab-a", "lab-b", "lab-failing", "lab-late"]
    assert await listed(state="failing") == ["lab-failing"]
    assert await listed(state="late") == ["lab-late"]
    assert await listed(label="team=a") == ["lab-a", "lab-susp"]
    assert await listed(label="team=a", state="active") == ["lab-a"]
    assert await listed(label="tier=2") == []
    # A relabel with an unchanged spec is recorded.
    await _labelled(db, "lab-b", {"team": "a"})
    assert await listed(label="team=a") == ["lab-a", "lab-b", "lab-susp"]
    # The filters survive into the next page's link.
    html = await (await client.get("/", params={"label": "team=a", "limit": "1"})).text()
    href = html_unescape(html.split('rel="next" href="', 1)[1].split('"', 1)[0])
    assert dict(parse_qsl(urlsplit(href).query))["label"] == "team=a"


async def test_jobs_sorted_by_next_run_across_pages(db: Database, client: TestClient) -> None:
    names = [f"nx-{i}" for i in range(5)]
    for n in names:
        await make_job(db, n, schedule="*/5 * * * *")
    # Distinct next runs in an order unlike the names' (nx-3 soonest, nx-0 ended: last).
    for n, minutes in (("nx-1", 50), ("nx-2", 30), ("nx-3", 10), ("nx-4", 30)):
        await set_cursor(db, n, f"date_trunc('minute', now()) + interval '{minutes} minutes'")
    await set_cursor(db, "nx-0", "NULL")
    expected = ["nx-3", "nx-2", "nx-4", "nx-1", "nx-0"]
    assert await _pages(client, {"sort": "next_run", "text": "nx-", "limit": "2"}, names) == (
        expected
    )
    assert await _pages(client, {"sort": "next_run", "text": "nx-", "limit": "1"}, names) == (
        expected
    )
    assert await _pages(client, {"text": "nx-", "limit": "2"}, names) == names


async def test_jobs_sorted_by_last_run_across_pages(db: Database, client: TestClient) -> None:
    names = [f"lr-{i}" for i in range(4)]
    ids = {n: (await make_job(db, n, schedule="*/5 * * * *")).id for n in names}
    async with db.connection() as conn:
        for n, ago in (("lr-0", 30), ("lr-2", 5), ("lr-3", 30)):
            await conn.execute(
                "INSERT INTO cronwell_job_counters (job_id, last_successful_at) "
                "VALUES (%s, date_trunc('minute', now()) - make_interval(mins => %s))",
                (ids[n], ago),
            )
    # Newest first; lr-0 and lr-3 tie (name descending); lr-1 never ran: last.
    expected = ["lr-2", "lr-3", "lr-0", "lr-1"]
    assert await _pages(client, {"sort": "last_run", "text": "lr-", "limit": "1"}, names) == (
        expected
    )
    assert await _pages(client, {"sort": "last_run", "text": "lr-", "limit": "3"}, names) == (
        expected
    )


async def test_jobs_schedule_in_words(db: Database, client: TestClient) -> None:
    await make_job(db, "words-job", schedule="0 2 * * 1")
    html = await (await client.get("/", params={"text": "words-job"})).text()
    assert '<span class="words">at 02:00 on Monday</span>' in html


@pytest.mark.parametrize(
    "query",
    [
        "slo=abc",
        "slo=0",
        "slo=nan",
        "min_replicas=-1",
        "min_replicas=1.5",
        "max_replicas=2&min_replicas=3",
        "concurrency_per_replica=0",
        "lead_time=99999",
        "pool=" + "x" * 300,
    ],
)
async def test_forecast_bad_parameters_are_400(client: TestClient, query: str) -> None:
    for path in ("/forecast", "/forecast.json"):
        r = await client.get(f"{path}?{query}")
        assert r.status == 400, (path, query)
        assert "Traceback" not in await r.text()
        assert_secure(r.headers)


@pytest.mark.parametrize(
    "query",
    [
        {"state": "sleeping"},
        {"sort": "age"},
        {"label": "novalue"},
        {"label": "a b=c"},
        {"label": "team=a=b"},
        {"sort": "next_run", "after": "default/x"},
        {"sort": "next_run", "after": "2026-01-01T00:00:00~default/x"},
        {"sort": "last_run", "after": "none~default/x"},
        {"sort": "next_run", "after": "2026-01-01T00:00:00+00:00~nons"},
    ],
)
async def test_bad_jobs_filters_are_400(client: TestClient, query: dict[str, str]) -> None:
    r = await client.get("/", params=query)
    assert r.status == 400
    assert "Traceback" not in await r.text()
    assert_secure(r.headers)


async def test_job_page_start_lag_histogram(db: Database, client: TestClient) -> None:
    job_id = await _labelled(db, "laggy", {})
    # Lags (seconds) of runs scheduled 1-4 hours ago, and one two days ago.
    seeded = [(60, 0.01), (120, 0.2), (180, 0.2), (240, 3.0), (2 * 24 * 60, 40.0)]
    await seed_started_runs(db, job_id, seeded)
    html = await (await client.get("/jobs/default/laggy")).text()
    assert "Start lag, last 24h" in html
    # percentile_cont over [0.01, 0.2, 0.2, 3.0]: p50 0.2, p99 0.2 + 0.97 * 2.8 = 2.916.
    assert "4 runs started" in html
    assert '<span class="p50">0.200 s</span>' in html
    assert '<span class="p99">2.916 s</span>' in html
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', html)]
    # Buckets: <50ms, [50,100)ms, [100,250)ms, ... [2,5)s is the 7th, >=60s the 11th.
    assert counts == [1, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]
    assert 'style="' not in html
    html = await (await client.get("/jobs/default/laggy", params={"window": "7d"})).text()
    assert "5 runs started" in html
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', html)]
    assert counts == [1, 0, 2, 0, 0, 0, 1, 0, 0, 1, 0]
    html = await (await client.get("/jobs/default/laggy", params={"window": "1h"})).text()
    assert "No run started in this window." in html
    r = await client.get("/jobs/default/laggy", params={"window": "2h"})
    assert r.status == 400
    assert_secure(r.headers)


async def test_healthz_is_ok_with_headers(client: TestClient) -> None:
    r = await client.get("/healthz")
    assert r.status == 200 and await r.text() == "ok"
    assert_secure(r.headers)


async def test_store_filters_by_visible_namespaces_before_the_page_limit(db: Database) -> None:
    """What --auth kubernetes passes the store: the namespaces a viewer may see. The filter
    is in the query, so a page of N holds N visible rows however many hidden ones sort
    before them, and a dead letter's namespace is found only among the visible ones."""
    hidden = [await dead_letter(db, "aa-hidden", f"h{i}") for i in range(3)]
    shown = [await dead_letter(db, "bb-shown", f"s{i}") for i in range(3)]
    assert await ui.namespaces(db) == ["aa-hidden", "bb-shown"]

    jobs = await ui.job_page(
        db, namespaces=["bb-shown"], namespace=None, pool=None, text=None, after=None, limit=2
    )
    assert [(j.namespace, j.name) for j in jobs] == [("bb-shown", "s0"), ("bb-shown", "s1")]
    everything = await ui.job_page(
        db, namespaces=None, namespace=None, pool=None, text=None, after=None, limit=10
    )
    assert len(everything) == 6
    none = await ui.job_page(
        db, namespaces=[], namespace="aa-hidden", pool=None, text=None, after=None, limit=10
    )
    assert none == []

    runs = await ui.run_page(
        db, namespaces=["bb-shown"], namespace=None, name=None, state=None, after=None, limit=3
    )
    assert sorted(r.idempotency_key for r in runs) == sorted(shown)
    dead = await ui.dead_page(db, namespaces=["bb-shown"], namespace=None, name=None, limit=3)
    assert sorted(d.idempotency_key for d in dead) == sorted(shown)
    assert await ui.dead_page(db, namespaces=[], namespace=None, name=None, limit=3) == []

    assert await ui.dead_namespace(db, key=hidden[0], namespaces=None) == "aa-hidden"
    assert await ui.dead_namespace(db, key=hidden[0], namespaces=["bb-shown"]) is None
    assert await ui.dead_namespace(db, key=shown[0], namespaces=["bb-shown"]) == "bb-shown"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--auth", "kubernetes"], 1, "--auth kubernetes needs the API server"),
        (["--auth-audience", "x"], 2, "--auth-audience needs --auth kubernetes"),
        (["--auth", "basic"], 2, "is not one of 'none', 'kubernetes'"),
    ],
)
def test_cronwell_ui_auth_mistakes_are_one_line(
    args: list[str], code: int, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything is served: no kubeconfig for --auth kubernetes (and no
    in-cluster config), an audience without it, an unknown mode."""
    from click.testing import CliRunner

    from cronwell.cli import main

    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(main, ["--database-url", "postgresql:///x", "ui", *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


# What keeps pages cheap on a large store (issue 29's bench, bench/ui.py).


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
