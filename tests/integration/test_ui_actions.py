"""The job page's actions against the real app and a real store, without a cluster (the
store path, as `cronwell trigger/suspend/resume/backfill`): what each changes, its bad
input (404, 400, 403, 409), and that submitting the same form twice acts once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from html import unescape

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell import backfill, jobs, schedule
from cronwell.store.db import Database
from cronwell.ui.app import CSRF_FIELD, UiConfig, make_app
from tests.integration.helpers import db_now, make_job, sql

JOB = "/jobs/default/act"


async def _client(db: Database, *, allow_actions: bool) -> TestClient:
    client = TestClient(TestServer(make_app(UiConfig(db=db, allow_actions=allow_actions))))
    await client.start_server()
    return client


@pytest.fixture
async def actions(db: Database) -> AsyncIterator[TestClient]:
    c = await _client(db, allow_actions=True)
    yield c
    await c.close()


@pytest.fixture
async def read_only(db: Database) -> AsyncIterator[TestClient]:
    c = await _client(db, allow_actions=False)
    yield c
    await c.close()


def _field(html: str, name: str) -> str:
    return unescape(html.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])


async def _job_row(db: Database, name: str = "act") -> dict[str, object]:
    (row,) = await sql(db, "SELECT * FROM cronwell_jobs WHERE name = %s", name)
    return row


async def _occurrences(db: Database) -> list[dict[str, object]]:
    return await sql(db, "SELECT * FROM cronwell_occurrences ORDER BY scheduled_for")


async def test_read_only_job_page_has_no_action_and_refuses_them(
    db: Database, read_only: TestClient
) -> None:
    await make_job(db, "act", schedule="0 3 * * *")
    html = await (await read_only.get(JOB)).text()
    assert 'method="post"' not in html and "Trigger now" not in html
    r = await read_only.get(JOB + "/backfill", params={"from": "2020-01-01", "until": "now"})
    assert r.status == 403
    for action in ("trigger", "suspend", "resume", "backfill"):
        r = await read_only.post(f"{JOB}/{action}", data={CSRF_FIELD: "x"})
        assert r.status == 403, action
    assert not (await _job_row(db))["suspended"]


async def test_trigger_now_runs_once_per_rendered_form(db: Database, actions: TestClient) -> None:
    applied = await make_job(db, "act", schedule="0 3 * * *")
    html = await (await actions.get(JOB)).text()
    assert f'action="{JOB}/trigger"' in html and "as <code>cronwell trigger</code>" in html
    form = {CSRF_FIELD: _field(html, CSRF_FIELD), "trigger_id": _field(html, "trigger_id")}

    r = await actions.post(f"{JOB}/trigger", data=form, allow_redirects=False)
    assert r.status == 303 and r.headers["Location"] == f"{JOB}?done=triggered"
    (occ,) = await _occurrences(db)
    assert occ["idempotency_key"] == schedule.trigger_key(applied.id, form["trigger_id"])
    assert occ["state"] == "pending"
    assert (
        "Triggered: one run is due now." in await (await actions.get(r.headers["Location"])).text()
    )

    # The same form again (a double click, a reload of the POST): nothing new.
    r = await actions.post(f"{JOB}/trigger", data=form, allow_redirects=False)
    assert r.headers["Location"] == f"{JOB}?done=already-triggered"
    assert len(await _occurrences(db)) == 1

    # A fresh render carries a fresh id: a second trigger is a second run.
    again = _field(await (await actions.get(JOB)).text(), "trigger_id")
    assert again != form["trigger_id"]
    await actions.post(f"{JOB}/trigger", data=form | {"trigger_id": again})
    assert len(await _occurrences(db)) == 2


async def test_trigger_bad_input(db: Database, actions: TestClient) -> None:
    await make_job(db, "act", schedule="0 3 * * *")
    token = _field(await (await actions.get(JOB)).text(), CSRF_FIELD)
    cases = [
        (f"{JOB}/trigger", {"trigger_id": "t1"}, 403),  # no CSRF token
        (f"{JOB}/trigger", {"trigger_id": "t1", CSRF_FIELD: "forged"}, 403),
        (f"{JOB}/trigger", {CSRF_FIELD: token}, 400),  # no trigger id
        (f"{JOB}/trigger", {"trigger_id": "a b/<c>", CSRF_FIELD: token}, 400),
        (f"{JOB}/trigger", {"trigger_id": "x" * 64, CSRF_FIELD: token}, 400),
        ("/jobs/default/nope/trigger", {"trigger_id": "t1", CSRF_FIELD: token}, 404),
    ]
    for path, data, status in cases:
        r = await actions.post(path, data=data)
        assert r.status == status, (path, data)
        assert "Traceback" not in await r.text()
    assert await _occurrences(db) == []
    assert (await actions.get(JOB, params={"done": "hacked"})).status == 400


async def test_suspend_and_resume_in_the_store_say_who_suspended(
    db: Database, actions: TestClient
) -> None:
    await make_job(db, "act", schedule="0 3 * * *")
    html = await (await actions.get(JOB)).text()
    token = _field(html, CSRF_FIELD)
    assert f'action="{JOB}/suspend"' in html and f'action="{JOB}/resume"' not in html

    r = await actions.post(f"{JOB}/suspend", data={CSRF_FIELD: "forged"})
    assert r.status == 403 and not (await _job_row(db))["suspended"]
    r = await actions.post(f"{JOB}/suspend", data={CSRF_FIELD: token}, allow_redirects=False)
    assert r.status == 303 and r.headers["Location"] == f"{JOB}?done=suspended"
    row = await _job_row(db)
    assert row["suspended"] and row["suspended_reason"] == "Manual"
    html = await (await actions.get(r.headers["Location"])).text()
    assert "yes, in the store by cronwell suspend or this dashboard (Manual)" in unescape(html)
    assert f'action="{JOB}/resume"' in html and f'action="{JOB}/suspend"' not in html

    r = await actions.post(f"{JOB}/resume", data={CSRF_FIELD: token}, allow_redirects=False)
    assert r.headers["Location"] == f"{JOB}?done=resumed"
    row = await _job_row(db)
    assert not row["suspended"] and row["suspended_reason"] is None
    # A second submit of the same form leaves it as it is.
    await actions.post(f"{JOB}/resume", data={CSRF_FIELD: token})
    assert not (await _job_row(db))["suspended"]
    r = await actions.post("/jobs/default/nope/suspend", data={CSRF_FIELD: token})
    assert r.status == 404


async def test_job_page_tells_spec_suspension_from_pause(db: Database, actions: TestClient) -> None:
    await make_job(db, "by-spec", schedule="0 3 * * *", suspend=True)
    await make_job(db, "paused", schedule="0 3 * * *")
    await jobs.pause(db, namespace="default", name="paused")
    html = unescape(await (await actions.get("/jobs/default/by-spec")).text())
    assert "yes, by its spec (spec.suspend: true)" in html
    assert "next cronwell apply of a changed spec with suspend: true" in html.replace(
        "<code>", ""
    ).replace("</code>", "")
    html = unescape(await (await actions.get("/jobs/default/paused")).text())
    assert "yes, in the store by cronwell pause (Paused)" in html


def _window(now: datetime) -> tuple[str, str, int]:
    """Three past hourly instants: from, until (both included) and their number."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    return start.isoformat(), (start + timedelta(hours=2)).isoformat(), 3


async def test_backfill_confirm_then_post_with_the_confirmed_count(
    db: Database, actions: TestClient
) -> None:
    await make_job(db, "act", schedule="0 * * * *")
    start, until, n = _window(await db_now(db))
    html = await (await actions.get(JOB)).text()
    assert f'action="{JOB}/backfill"' in html and "read in UTC" in html
    r = await actions.get(f"{JOB}/backfill", params={"from": start, "until": until})
    assert r.status == 200
    page = await r.text()
    assert f"<strong>{n}</strong> will run now" in page
    assert _field(page, "expect") == str(n) and _field(page, "from") == start
    form = {k: _field(page, k) for k in (CSRF_FIELD, "from", "until", "expect")}
    assert await _occurrences(db) == []  # the confirmation wrote nothing

    # Meanwhile one instant of the window gets its run: the confirmed count is stale.
    first = datetime.fromisoformat(start)
    await backfill.backfill(db, namespace="default", name="act", start=first, end=first)
    r = await actions.post(f"{JOB}/backfill", data=form)
    assert r.status == 409 and "not the 3 confirmed" in await r.text()
    assert len(await _occurrences(db)) == 1

    r = await actions.post(
        f"{JOB}/backfill", data=form | {"expect": str(n - 1)}, allow_redirects=False
    )
    assert r.status == 303 and r.headers["Location"] == f"{JOB}?backfilled={n - 1}"
    occs = await _occurrences(db)
    assert [o["scheduled_for"] for o in occs] == [first + timedelta(hours=h) for h in range(n)]
    assert all(o["origin"] == "backfill" for o in occs)
    html = await (await actions.get(r.headers["Location"])).text()
    assert f"Backfilled: {n - 1} instant(s)" in html
    # The same form again: nothing left to run, refused, nothing doubled.
    r = await actions.post(f"{JOB}/backfill", data=form | {"expect": str(n - 1)})
    assert r.status == 409
    assert len(await _occurrences(db)) == n


async def test_backfill_bad_input(db: Database, actions: TestClient) -> None:
    await make_job(db, "act", schedule="* * * * *")
    now = await db_now(db)
    token = _field(await (await actions.get(JOB)).text(), CSRF_FIELD)
    week = (now - timedelta(days=8)).isoformat(), (now - timedelta(minutes=1)).isoformat()
    gets = [
        ({"from": "yesterday", "until": "now"}, 400, "from: 'yesterday': use ISO-8601"),
        ({"until": "now"}, 400, "from is required"),
        ({"from": week[0], "until": week[1]}, 400, "more than 10000 instants"),
        ({"from": week[1], "until": week[0]}, 400, "give the earlier instant first"),
        ({"from": week[1], "until": (now + timedelta(hours=1)).isoformat()}, 400, "future"),
    ]
    for params, status, says in gets:
        r = await actions.get(f"{JOB}/backfill", params=params)
        text = await r.text()
        assert r.status == status and says in unescape(text), (params, text)
        assert "Traceback" not in text
    r = await actions.get("/jobs/default/nope/backfill", params={"from": week[0], "until": "now"})
    assert r.status == 404
    posts = [
        ({"from": week[0], "until": week[1], "expect": "1"}, 403),  # no CSRF token
        ({"from": week[0], "until": week[1], "expect": "1", CSRF_FIELD: "forged"}, 403),
        ({"from": week[1], "until": week[1], CSRF_FIELD: token}, 400),  # no expect
        ({"from": week[1], "until": week[1], "expect": "-1", CSRF_FIELD: token}, 400),
        ({"from": "x", "until": week[1], "expect": "1", CSRF_FIELD: token}, 400),
        ({"from": week[0], "until": week[1], "expect": "11520", CSRF_FIELD: token}, 400),
    ]
    for data, status in posts:
        r = await actions.post(f"{JOB}/backfill", data=data)
        assert r.status == status, data
    r = await actions.post(
        "/jobs/default/nope/backfill",
        data={"from": week[1], "until": week[1], "expect": "1", CSRF_FIELD: token},
    )
    assert r.status == 404
    assert await _occurrences(db) == []
