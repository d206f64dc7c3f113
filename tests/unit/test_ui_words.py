"""The dashboard's schedules in words: the shapes people write are said, the rest (hashed,
last-day, nth-weekday forms) is left to the cron itself rather than said wrongly."""

from __future__ import annotations

import pytest

from cronwell.ui.words import describe


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("*/5 * * * *", "every 5 minutes"),
        ("* * * * *", "every minute"),
        ("0 2 * * 1", "at 02:00 on Monday"),
        ("30 2 * * *", "daily at 02:30"),
        ("0 9 * * mon-fri", "at 09:00 on Monday through Friday"),
        ("*/15 9-17 * * 1-5", "every 15 minutes from 09:00 to 17:59 on Monday through Friday"),
        ("15 * * * *", "every hour at minute 15"),
        ("0 */2 * * *", "every 2 hours at minute 0"),
        ("0 0 1 jan *", "at 00:00 on day 1 of the month in January"),
        ("0 9 1,15 * *", "at 09:00 on day 1, 15 of the month"),
        ("0 0 * * 0,6", "at 00:00 on Sunday and Saturday"),
        ("0 0 * * 7", "at 00:00 on Sunday"),
        ("* * * * * *", "every second"),
        ("*/10 * * * * *", "every 10 seconds"),
        ("5 0 2 * * thu", "at 02:00:05 on Thursday"),
        ("@hourly", "every hour"),
        ("@daily", "daily at 00:00"),
        ("@weekly", "at 00:00 on Sunday"),
        ("@every 5m", "every 5 minutes"),
        ("@every 1h", "every hour"),
        ("@every 90s", "every 1 minute 30 seconds"),
    ],
)
def test_said(cron: str, words: str) -> None:
    assert describe(cron) == words


@pytest.mark.parametrize(
    "cron",
    ["H 2 * * *", "0 0 L * *", "0 0 * * 5#2", "0 0 15W * *", "0,30 * * * *", "@every", "x y"],
)
def test_left_to_the_cron(cron: str) -> None:
    assert describe(cron) is None
