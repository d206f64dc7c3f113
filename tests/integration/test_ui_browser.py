"""The dashboard in a real browser (Debian's chromium + chromedriver, headless, through
Selenium; nothing downloads a browser): every view loads with no CSP violation or script
error in the console, the theme toggle switches, the forecast chart is drawn (uPlot) in the
viewer's time zone, a job is followed from the list to its runs, the zone switch and the
runs' refresh control work (the refresh pauses while the tab is hidden), every view fits a
390 px phone, a dead letter is replayed with its button, a job is triggered from its page,
and light/dark screenshots of each view land in docs/images/ for the docs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from aiohttp.test_utils import TestServer

from cronwell import dispatch
from cronwell.store import prescales, processes
from cronwell.store.db import Database
from cronwell.ui.app import UiConfig, make_app
from tests.helpers.store import fail_dead
from tests.integration.helpers import make_job, seed_runs, seed_started_runs, sql
from tests.integration.worker_helpers import handler_job, occurrence, trigger

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
VIEWER_ZONE = "Asia/Kolkata"
"""The browser's zone (UTC+05:30): instants must be shown in it, not in UTC."""
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEWS = [
    ("jobs", "/"),
    ("job", "/jobs/default/nightly-report"),
    ("runs", "/runs"),
    ("dead", "/dead"),
    ("status", "/status"),
    ("forecast", "/forecast?concurrency_per_replica=2&slo=1"),
]
PHONE_WIDTH = 390

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (hack/sysdeps.sh)",
)


@pytest.fixture
async def base_url(db: Database) -> AsyncIterator[str]:
    job = await make_job(db, "nightly-report", schedule="0 3 * * *", timeZone="Europe/Paris")
    # Runs with start lags, so the job page draws its histogram (SVG under the CSP).
    await seed_started_runs(db, job.id, [(60 * h, 0.02 * h) for h in range(1, 20)])
    await make_job(db, "every-minute", schedule="* * * * *")
    for i in range(8):
        await make_job(db, f"batch-{i}", schedule="*/15 * * * *", pool="batch")
    # The status page's workers and backlog: a worker half busy, a run due and not started.
    await processes.heartbeat(
        db,
        processes.ProcessEntry(
            id="worker-a", role="worker", pool="default", hostname="node-1", pid=1,
            version="dev", concurrency=8, running=4,
        ),
    )  # fmt: skip
    await seed_runs(db, job.id, "default", [2], state="pending")
    # The forecast's recent pre-scales: pool batch's last one, Ready 20 s before its burst.
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=16)
    await prescales.record(
        db,
        prescales.PreScaleRecord(
            "ops", "batch", "batch", at, 3, at + timedelta(seconds=60),
            at + timedelta(seconds=40), True,
        ),
    )  # fmt: skip
    server = TestServer(make_app(UiConfig(db=db)), host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,800")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(str(CHROMEDRIVER), env=os.environ | {"TZ": VIEWER_ZONE})
    return webdriver.Chrome(service=service, options=opts)


def _problems(driver: Any, path: str) -> list[str]:
    """Console errors and CSP violations logged since the last call."""
    return [
        f"{path}: {e['message']}"
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]
    ]


def _browse(base_url: str) -> list[str]:
    driver = _driver()
    problems: list[str] = []
    try:
        IMAGES.mkdir(parents=True, exist_ok=True)
        for name, path in VIEWS:
            driver.get(base_url + path)
            for theme in ("light", "dark"):
                driver.execute_script("localStorage.setItem('cronwell-theme', arguments[0])", theme)
                driver.refresh()
                got = driver.execute_script("return document.documentElement.dataset.theme")
                assert got == theme, (path, got)
                driver.save_screenshot(str(IMAGES / f"ui-{name}-{theme}.png"))
                if name == "job":  # below the fold: the start-lag histogram on its own
                    chart = driver.find_element("css selector", "svg.hist")
                    chart.screenshot(str(IMAGES / f"ui-job-lag-{theme}.png"))
                if name == "forecast":  # below the fold: the recent pre-scales
                    table = driver.find_element("css selector", "table.prescales")
                    table.screenshot(str(IMAGES / f"ui-forecast-prescales-{theme}.png"))
            problems += _problems(driver, path)
        # The forecast: one uPlot chart per pool, its table folded, instants in the viewer's
        # zone (the JSON says UTC; the browser runs in UTC+05:30).
        driver.get(base_url + "/forecast?concurrency_per_replica=2&slo=1")
        charts = driver.execute_script(
            "return [...document.querySelectorAll('.chart')].map("
            "c => c.querySelectorAll('.uplot canvas').length)"
        )
        assert charts == [1, 1], charts
        assert driver.execute_script("return new Date().getTimezoneOffset()") == -330
        for table in ("bursts", "prescales"):  # what is coming, and what came
            shown = driver.execute_script(
                f"const t = document.querySelector('table.{table} time');"
                "return [t.getAttribute('datetime'), t.textContent]"
            )
            when = datetime.fromisoformat(shown[0]).astimezone(ZoneInfo(VIEWER_ZONE))
            assert f"{when.hour % 12 or 12}:{when.minute:02d}" in shown[1], shown
        assert (
            driver.execute_script("return document.querySelector('details.per-minute').open")
            is False
        )
        # The toggle redraws the charts in the other theme's colours.
        driver.find_element("id", "theme-toggle").click()
        assert driver.execute_script(
            "return document.querySelectorAll('.chart .uplot').length"
        ) == len(charts)
        problems += _problems(driver, "/forecast")
        driver.get(base_url + "/")
        before = driver.execute_script("return document.documentElement.dataset.theme")
        driver.find_element("id", "theme-toggle").click()
        after = driver.execute_script("return document.documentElement.dataset.theme")
        assert before != after
        problems += _follow_a_job_to_its_runs(driver, base_url)
        problems += _switch_zone(driver, base_url)
        problems += _refresh_control(driver, base_url)
        problems += _phone(driver, base_url)
    finally:
        driver.quit()
    return problems


def _follow_a_job_to_its_runs(driver: Any, base_url: str) -> list[str]:
    """From the jobs list, click a job, then its "All runs" link: only its runs are listed."""
    driver.get(base_url + "/")
    driver.find_element("link text", "nightly-report").click()
    assert driver.current_url == base_url + "/jobs/default/nightly-report"
    driver.find_element("css selector", "a.all-runs").click()
    assert driver.current_url == base_url + "/runs?namespace=default&job=nightly-report"
    jobs = driver.execute_script(
        "return [...document.querySelectorAll('#runs tbody td:first-child a')]"
        ".map(a => a.textContent)"
    )
    assert jobs and set(jobs) == {"default/nightly-report"}, jobs
    return _problems(driver, "follow a job")


def _switch_zone(driver: Any, base_url: str) -> list[str]:
    """The zone switch shows the job page's instants in the viewer's zone, UTC or the job's
    (Europe/Paris), and is remembered; a page without job zones does not offer the job's."""
    from selenium.webdriver.support.ui import Select

    driver.get(base_url + "/jobs/default/nightly-report")
    stamp = "document.querySelector('time[data-zone]')"
    at = datetime.fromisoformat(driver.execute_script(f"return {stamp}.getAttribute('datetime')"))
    for mode, zone in (("utc", "UTC"), ("job", "Europe/Paris"), ("local", VIEWER_ZONE)):
        Select(driver.find_element("id", "zone-switch")).select_by_value(mode)
        when = at.astimezone(ZoneInfo(zone))
        text = driver.execute_script(f"return {stamp}.textContent")
        assert f"{when.hour % 12 or 12}:{when.minute:02d}" in text, (mode, text)
        if mode == "utc":
            assert "UTC" in text, text
    Select(driver.find_element("id", "zone-switch")).select_by_value("job")
    driver.execute_script("localStorage.setItem('cronwell-theme', 'light')")
    driver.refresh()
    assert driver.execute_script("return document.documentElement.dataset.zone") == "job"
    driver.save_screenshot(str(IMAGES / "ui-job-zone-light.png"))
    driver.get(base_url + "/status")  # instants of no job: the viewer's
    assert driver.execute_script("return document.documentElement.dataset.zone") == "local"
    assert not driver.find_elements("css selector", "#zone-switch option[value=job]")
    driver.execute_script("localStorage.removeItem('cronwell-zone')")
    return _problems(driver, "zone switch")


HIDDEN = "Object.defineProperty(document, 'hidden', {configurable: true, get: () => %s})"


def _refresh_control(driver: Any, base_url: str) -> list[str]:
    """The runs page's refresh interval is changed and remembered; while the tab is hidden
    no refresh is sent, and one is sent as soon as it is visible again."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver.get(base_url + "/runs")
    poll = "return document.getElementById('runs').dataset.poll"
    assert driver.execute_script(poll) == "5000"
    Select(driver.find_element("id", "refresh")).select_by_value("2")
    assert driver.execute_script(poll) == "2000"
    driver.refresh()
    assert Select(driver.find_element("id", "refresh")).first_selected_option.text == "every 2 s"
    assert driver.execute_script(poll) == "2000"
    driver.execute_script(
        "window.polls = 0; document.body.addEventListener('htmx:beforeRequest',"
        " () => window.polls++);" + HIDDEN % "true"
    )
    time.sleep(4.5)  # two intervals of 2 s, hidden: nothing is sent
    assert driver.execute_script("return window.polls") == 0
    driver.execute_script(
        HIDDEN % "false" + "; document.dispatchEvent(new Event('visibilitychange'))"
    )
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return window.polls") > 0)
    Select(driver.find_element("id", "refresh")).select_by_value("0")
    driver.refresh()
    assert driver.execute_script(poll) == "0"
    assert Select(driver.find_element("id", "refresh")).first_selected_option.text == "off"
    return _problems(driver, "refresh control")


def _phone(driver: Any, base_url: str) -> list[str]:
    """At 390 px every view fits the screen's width (the nav wraps, tables scroll in their
    own box); screenshots of the jobs and runs views."""
    driver.set_window_size(PHONE_WIDTH, 844)
    driver.execute_script(
        "localStorage.setItem('cronwell-theme', 'light');"
        " localStorage.removeItem('cronwell-refresh')"
    )
    try:
        for name, path in VIEWS:
            driver.get(base_url + path)
            width = driver.execute_script(
                "return [window.innerWidth, document.documentElement.scrollWidth]"
            )
            assert width[1] <= width[0] <= PHONE_WIDTH, (path, width)
            if name in ("jobs", "runs"):
                driver.save_screenshot(str(IMAGES / f"ui-{name}-phone-light.png"))
        return _problems(driver, "phone")
    finally:
        driver.set_window_size(1280, 800)


@pytest.mark.timeout(240)
async def test_every_view_in_chromium_light_and_dark(base_url: str) -> None:
    problems = await asyncio.to_thread(_browse, base_url)
    assert problems == []


def _replay(base_url: str, key: str) -> list[str]:
    """Click the Replay button of `key` on /dead; back on /dead, the key is gone."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver()
    try:
        driver.get(base_url + "/dead")
        assert key in driver.page_source
        row = driver.find_element("xpath", f"//tr[td/code[text()='{key}']]")
        row.find_element("css selector", "button.replay").click()
        WebDriverWait(driver, 10).until(expected_conditions.url_contains("replayed="))
        assert driver.current_url == base_url + "/dead?replayed=1", driver.current_url
        assert "1 dead letter(s) replayed." in driver.page_source
        assert key not in driver.page_source
        return _problems(driver, "/dead")
    finally:
        driver.quit()


@pytest.mark.timeout(120)
async def test_replay_a_dead_letter_from_the_dead_page(db: Database) -> None:
    await handler_job(db, "browser-dead", "t-fail-while", retry={"maxAttempts": 2})
    key = await trigger(db, "browser-dead")
    (c,) = await dispatch.claim(db, pool="default", worker_id="w1", limit=5, lease_seconds=60)
    assert await fail_dead(db, key, c.fence, "HTTP400", "answered 400") == "dead"
    server = TestServer(make_app(UiConfig(db=db, allow_actions=True)), host="127.0.0.1")
    await server.start_server()
    try:
        problems = await asyncio.to_thread(_replay, f"http://127.0.0.1:{server.port}", key)
    finally:
        await server.close()
    assert problems == []
    assert (await occurrence(db, key))["state"] == "pending"


def _trigger_now(base_url: str, path: str) -> list[str]:
    """Click Trigger now on a job's page; back on it, the page says the run is due."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver()
    try:
        driver.get(base_url + path)
        driver.find_element("css selector", "button.trigger").click()
        WebDriverWait(driver, 10).until(expected_conditions.url_contains("done="))
        assert driver.current_url == base_url + path + "?done=triggered", driver.current_url
        assert "Triggered: one run is due now." in driver.page_source
        return _problems(driver, path)
    finally:
        driver.quit()


@pytest.mark.timeout(120)
async def test_trigger_a_job_from_its_page(db: Database) -> None:
    job = await make_job(db, "browser-trigger", schedule="0 3 * * *")
    server = TestServer(make_app(UiConfig(db=db, allow_actions=True)), host="127.0.0.1")
    await server.start_server()
    try:
        base = f"http://127.0.0.1:{server.port}"
        problems = await asyncio.to_thread(_trigger_now, base, "/jobs/default/browser-trigger")
    finally:
        await server.close()
    assert problems == []
    (row,) = await sql(db, "SELECT * FROM cronwell_occurrences WHERE job_id = %s", job.id)
    assert row["origin"] == "trigger" and row["state"] == "pending"
