"""The dashboard against the real app and a real store: pages render data, filters and
keyset pagination work, every response carries the security headers, bad input is a 4xx
page, and no state-changing route is reachable without --allow-actions and the CSRF
token."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import AsyncIterator
from html import unescape as html_unescape
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell import dispatch
from cronwell.store import ui
from cronwell.store.db import Database
from cronwell.ui.app import CONFIG, CSRF_FIELD, SECURITY_HEADERS, UiConfig, make_app
from tests.helpers.store import dead_letter, fail_dead
from tests.integration.helpers import make_job
from tests.integration.worker_helpers import handler_job, occurrence, trigger


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
        assert r.status == 303 and r.headers["Location"] == "/dead"
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
