"""The CLI's one duration parser and one instant parser accept what every command
accepted before they were merged (`cronwell scheduler --retention`, `forecast --horizon`,
`dlq purge --older-than`, `backfill --from`) and refuse the rest in one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import click
import pytest

from cronwell.cli import duration_option, parse_duration, parse_instant


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        (" 90 ", 90),
        ("1.5", 1.5),
        ("1e3", 1000),  # plain numbers as Python reads them (dlq purge took these)
        ("0", 0),
        ("30s", 30),
        ("5m", 300),
        ("1H", 3600),
        ("1h30m", 5400),
        ("1h30", 3630),  # a part without a unit counts seconds (scheduler --retention)
        ("2d", 172800),
        ("1d12h", 129600),
        ("2w", 1209600),
        ("0.5m", 30),
    ],
)
def test_durations_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "5x", "1d 2h", "-1d", "-5", "h5", "nan", "inf", "1..5s"])
def test_durations_refused_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid duration .*: use e\.g\. 90s") as e:
        parse_duration(text)
    assert "\n" not in str(e.value)


def test_duration_option_reports_against_the_option_and_keeps_unset() -> None:
    assert duration_option(click.Context(click.Command("x")), click.Option(["--d"]), None) is None
    with pytest.raises(click.BadParameter, match="invalid duration '7 days'"):
        duration_option(click.Context(click.Command("x")), click.Option(["--d"]), "7 days")


def test_instants() -> None:
    assert parse_instant("2026-03-29T00:00:00Z") == datetime(2026, 3, 29, tzinfo=UTC)
    assert parse_instant("2026-03-29") == datetime(2026, 3, 29, tzinfo=UTC)
    plus2 = timezone(timedelta(hours=2))
    assert parse_instant("2026-03-29T02:30+02:00") == datetime(2026, 3, 29, 2, 30, tzinfo=plus2)
    before = datetime.now(UTC)
    assert before <= parse_instant(" NOW ") <= datetime.now(UTC)
    with pytest.raises(ValueError, match="'yesterday': use ISO-8601"):
        parse_instant("yesterday")
