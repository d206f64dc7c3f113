"""The dashboard in a real browser (Debian's chromium + chromedriver, headless, through
Selenium; nothing downloads a browser): every view loads with no CSP violation or script
error in the console, the theme toggle switches, and light/dark screenshots of each view
land in docs/images/ for the docs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from cronwell.store.db import Database
from cronwell.ui.app import UiConfig, make_app
from tests.integration.helpers import make_job, seed_started_runs

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

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
    server = TestServer(make_app(UiConfig(db=db)), host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


def _browse(base_url: str) -> list[str]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,800")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    problems: list[str] = []
    try:
        IMAGES.mkdir(parents=True, exist_ok=True)
        for name, path in [
            ("jobs", "/"),
            ("job", "/jobs/default/nightly-report"),
            ("runs", "/runs"),
            ("dead", "/dead"),
            ("status", "/status"),
        ]:
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
            problems += [
                f"{path}: {e['message']}"
                for e in driver.get_log("browser")
                if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]
            ]
        driver.get(base_url + "/")
        before = driver.execute_script("return document.documentElement.dataset.theme")
        driver.find_element("id", "theme-toggle").click()
        after = driver.execute_script("return document.documentElement.dataset.theme")
        assert before != after
    finally:
        driver.quit()
    return problems


@pytest.mark.timeout(180)
async def test_every_view_in_chromium_light_and_dark(base_url: str) -> None:
    problems = await asyncio.to_thread(_browse, base_url)
    assert problems == []
