"""The dashboard against the real app and a real store: pages render data, filters and
keyset pagination work, every response carries the security headers, bad input is a 4xx
page, and no state-changing route is reachable without --allow-actions and the CSRF
token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell.store.db import Database
from cronwell.ui.app import CSRF_FIELD, SECURITY_HEADERS, UiConfig, make_app
from tests.integration.helpers import make_job


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
            r = await read_only.request(method, url, data={CSRF_FIELD: "x"})
            assert r.status == 403, (method, path)
            r = await actions.request(method, url, data={})
            assert r.status == 403, (method, path)
            r = await actions.request(method, url, data={CSRF_FIELD: "forged"})
            assert r.status == 403, (method, path)
            assert_secure(r.headers)
    finally:
        await read_only.close()
        await actions.close()
