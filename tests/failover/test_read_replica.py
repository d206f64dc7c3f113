"""Reads off a streaming replica (store/replica.py), on a real primary and standby
(tests/failover/replication.py, one pair for the module): the dashboard's pages and
`cronwell jobs` / `runs` read from the standby (a row written on the primary while the
standby's replay is paused is not shown until replay resumes); an action from the
dashboard lands on the primary; a standby past the lag bound, or dead, sends reads to the
primary with one log line, never an error page."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from html import unescape

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store import Database
from cronwell.store import jobs as store_jobs
from cronwell.store.replica import ReadDatabase
from cronwell.ui.app import CSRF_FIELD, UiConfig, make_app
from tests.conftest import REPO
from tests.failover.replication import (  # noqa: F401
    Node,
    Pair,
    replayed,
    replica_pair,
    replica_primary,
)
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.failover]

NO_BOUND = 300.0
"""A lag bound no paused replay reaches during a test: reads stay on the standby."""


async def apply(db: Database, name: str) -> jobs.Applied:
    spec = ScheduledJobSpec.model_validate(
        {"schedule": "0 3 * * *", "target": {"log": {"message": name}}}
    )
    return await jobs.apply_job(db, namespace="rr", name=name, spec=spec)


def has_job(standby: Node, name: str) -> bool:
    return replayed(standby, f"SELECT 1 FROM cronwell_jobs WHERE name = '{name}'")


async def replay_until(standby: Node, name: str) -> None:
    """Wait until the standby has replayed the job `name`."""
    await wait_for(
        lambda: asyncio.to_thread(has_job, standby, name),
        timeout=60,
        what=f"the standby to replay {name}",
    )


async def catch_up(standby: Node, name: str) -> None:
    """Let the standby replay up to the job `name`, then pause its replay again."""
    standby.sql("SELECT pg_wal_replay_resume()")
    await replay_until(standby, name)
    standby.sql("SELECT pg_wal_replay_pause()")


@pytest.fixture
def paused(pair: Pair) -> Iterator[Node]:
    """The standby, its replay paused for the test (resumed after)."""
    pair.h2.sql("SELECT pg_wal_replay_pause()")
    yield pair.h2
    pair.h2.sql("SELECT pg_wal_replay_resume()")


@pytest.fixture
async def dashboard(
    pair: Pair, primary: Database
) -> AsyncIterator[tuple[TestClient, ReadDatabase]]:
    """The dashboard with actions, its reads on the standby (no lag bound in reach)."""
    async with ReadDatabase(pair.h2.url, primary, max_lag_seconds=NO_BOUND) as reads:
        primary.reads = reads
        client = TestClient(TestServer(make_app(UiConfig(db=primary, allow_actions=True))))
        await client.start_server()
        try:
            yield client, reads
        finally:
            await client.close()
            primary.reads = primary


def cli(*args: str, read_url: str, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronwell", "--database-url", url, *args],
        env=os.environ | {"CRONWELL_DATABASE_READ_URL": read_url} | env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


async def test_pages_and_cli_views_read_from_the_standby(
    pair: Pair, primary: Database, paused: Node, dashboard: tuple[TestClient, ReadDatabase]
) -> None:
    client, reads = dashboard
    early = await apply(primary, "rr-early")
    await jobs.trigger_job(primary, namespace="rr", name="rr-early", trigger_id="one")
    await catch_up(paused, "rr-early")
    # Written on the primary while the standby replays nothing.
    await apply(primary, "rr-paused")
    await jobs.trigger_job(primary, namespace="rr", name="rr-early", trigger_id="two")

    page = await (await client.get("/", params={"namespace": "rr"})).text()
    assert "rr-early" in page and "rr-paused" not in page
    runs = await (await client.get("/runs", params={"namespace": "rr"})).text()
    assert runs.count('href="/jobs/rr/rr-early"') == 1
    big = {"CRONWELL_DATABASE_READ_MAX_LAG_SECONDS": str(NO_BOUND)}
    listed = cli("jobs", "-n", "rr", url=pair.h1.url, read_url=pair.h2.url, **big)
    assert listed.returncode == 0, listed.stderr
    assert "rr-early" in listed.stdout and "rr-paused" not in listed.stdout
    shown = cli("runs", "-n", "rr", "--json", url=pair.h1.url, read_url=pair.h2.url, **big)
    assert shown.returncode == 0, shown.stderr
    keys = [json.loads(line)["idempotency_key"] for line in shown.stdout.splitlines()]
    assert keys == [f"{early.id}:trigger:one"], keys
    status = cli("status", url=pair.h1.url, read_url=pair.h2.url, **big)
    assert status.returncode == 0, status.stderr  # the fence epoch is the primary's
    assert "fences: generation 0, timeline 1" in status.stdout, status.stdout
    # The status page's durability and fence epoch describe the primary (it streams to
    # the standby; the standby has no WAL position to give), its counts come from the standby.
    page = await (await client.get("/status")).text()
    assert "asynchronous (standbys: 1 connected)" in page, page
    assert reads.why_not is None and reads.fallback_reads == 0

    paused.sql("SELECT pg_wal_replay_resume()")
    await replay_until(paused, "rr-paused")
    page = await (await client.get("/", params={"namespace": "rr"})).text()
    assert "rr-paused" in page
    runs = await (await client.get("/runs", params={"namespace": "rr"})).text()
    assert runs.count('href="/jobs/rr/rr-early"') == 2


def _field(html: str, name: str) -> str:
    return unescape(html.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])


async def test_an_action_lands_on_the_primary(
    pair: Pair, primary: Database, paused: Node, dashboard: tuple[TestClient, ReadDatabase]
) -> None:
    client, _ = dashboard
    await apply(primary, "acted")
    await catch_up(paused, "acted")
    html = await (await client.get("/jobs/rr/acted")).text()  # read on the standby
    r = await client.post(
        "/jobs/rr/acted/suspend",
        data={CSRF_FIELD: _field(html, CSRF_FIELD)},
        allow_redirects=False,
    )
    assert r.status == 303, await r.text()
    suspended = "SELECT suspended FROM cronwell_jobs WHERE name = 'acted'"
    assert pair.h1.sql(suspended) == [(True,)]
    assert paused.sql(suspended) == [(False,)]  # replay paused: the write went to the primary


async def test_a_standby_past_the_lag_bound_sends_reads_to_the_primary(
    pair: Pair, primary: Database, paused: Node, caplog: pytest.LogCaptureFixture
) -> None:
    await apply(primary, "rr-late")
    # Received, not replayed, and older than the bound: the standby is behind.
    await wait_for(
        lambda: asyncio.to_thread(
            paused.sql,
            "SELECT 1 WHERE pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn() AND "
            "now() - pg_last_xact_replay_timestamp() > interval '1 second'",
        ),
        timeout=60,
        what="the standby to fall a second behind",
    )
    caplog.set_level(logging.INFO, logger="cronwell.store.replica")
    async with ReadDatabase(pair.h2.url, primary, max_lag_seconds=1.0, check_seconds=0.01) as reads:
        assert "rr-late" in await names(reads)  # from the primary
        assert reads.why_not is not None and "behind the primary" in reads.why_not
        assert "reads moved to the primary" in caplog.text
        paused.sql("SELECT pg_wal_replay_resume()")
        await replay_until(paused, "rr-late")
        await wait_for(reads.on_replica, timeout=60, what="reads back on the standby")
        assert "rr-late" in await names(reads)  # from the standby again
        assert "reads back on the read replica" in caplog.text


async def names(db: Database) -> list[str]:
    return [j.name for j in await store_jobs.list_live(db, namespace="rr")]


async def test_a_dead_standby_sends_reads_to_the_primary(
    pair: Pair,
    primary: Database,
    dashboard: tuple[TestClient, ReadDatabase],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, reads = dashboard
    await apply(primary, "survivor")
    await replay_until(pair.h2, "survivor")
    assert "survivor" in await (await client.get("/", params={"namespace": "rr"})).text()
    caplog.set_level(logging.WARNING, logger="cronwell.store.replica")
    pair.h2.kill()  # its pooled connections die with it
    try:
        r = await client.get("/", params={"namespace": "rr"})
        assert r.status == 200 and "survivor" in await r.text()
        assert reads.why_not is not None and "unreachable" in reads.why_not
        [moved] = [r for r in caplog.records if "reads moved" in r.getMessage()]
        assert "\n" not in moved.getMessage()  # one line, whatever psycopg's message holds
        assert (await client.get("/status")).status == 200
        shown = cli("runs", "-n", "rr", url=pair.h1.url, read_url=pair.h2.url)
        assert shown.returncode == 0, shown.stderr
        assert "reads moved to the primary" in shown.stderr and "Traceback" not in shown.stderr
    finally:
        pair.h2.relaunch()
