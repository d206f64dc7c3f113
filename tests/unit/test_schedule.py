"""Schedule math: cron, seconds, macros, H, time zones and the DST policy."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from cronwell import schedule
from cronwell.cronexpr import load_zone, validate_cron
from cronwell.errors import SpecError
from cronwell.models import FallBack, SpringForward
from cronwell.schedule import CronSchedule


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


def cron(
    expr: str,
    tz: str = "UTC",
    spring: SpringForward = SpringForward.RUN_AT_GAP_END,
    fall: FallBack = FallBack.RUN_ONCE,
    hash_id: str = "",
) -> CronSchedule:
    return CronSchedule(expr, load_zone(tz), spring, fall, hash_id)


def take(s: CronSchedule, start: datetime, n: int) -> list[datetime]:
    out, t = [], start
    for _ in range(n):
        t = s.next_after(t)
        out.append(t)
    return out


def test_five_fields_utc() -> None:
    assert take(cron("*/20 * * * *"), utc(2026, 1, 1, 0, 0), 3) == [
        utc(2026, 1, 1, 0, 20),
        utc(2026, 1, 1, 0, 40),
        utc(2026, 1, 1, 1, 0),
    ]


def test_next_after_is_strict() -> None:
    assert cron("0 * * * *").next_after(utc(2026, 1, 1, 5, 0)) == utc(2026, 1, 1, 6, 0)


def test_six_fields_seconds_first() -> None:
    assert take(cron("*/15 * * * * *"), utc(2026, 1, 1), 3) == [
        utc(2026, 1, 1, 0, 0, 15),
        utc(2026, 1, 1, 0, 0, 30),
        utc(2026, 1, 1, 0, 0, 45),
    ]
    # seconds first: "30 0 * * * *" is second 30 of minute 0 of every hour
    assert cron("30 0 * * * *").next_after(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 1, 0, 30)


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", utc(2026, 1, 1, 1)),
        ("@daily", utc(2026, 1, 2)),
        ("@midnight", utc(2026, 1, 2)),
        ("@weekly", utc(2026, 1, 4)),
        ("@monthly", utc(2026, 2, 1)),
        ("@yearly", utc(2027, 1, 1)),
    ],
)
def test_macros(macro: str, expected: datetime) -> None:
    assert cron(macro).next_after(utc(2026, 1, 1, 0, 0, 1)) == expected


def test_h_is_stable_per_job_and_spreads_jobs() -> None:
    a1 = cron("H H * * *", hash_id="job-a").next_after(utc(2026, 1, 1))
    a2 = cron("H H * * *", hash_id="job-a").next_after(utc(2026, 1, 1))
    assert a1 == a2
    minutes = {
        cron("H * * * *", hash_id=str(uuid.uuid4())).next_after(utc(2026, 1, 1)).minute
        for _ in range(40)
    }
    assert len(minutes) > 10


@pytest.mark.parametrize(
    "expr", ["61 * * * *", "* * *", "every day", "@fortnightly", "* * * * * * * *", "0 25 * * *"]
)
def test_invalid_cron_is_rejected_with_the_fix(expr: str) -> None:
    with pytest.raises(SpecError) as e:
        validate_cron(expr)
    assert "cron" in str(e.value) or "macro" in str(e.value)
    assert e.value.field == "spec.schedule"


def test_unknown_zone() -> None:
    with pytest.raises(SpecError, match=r"unknown time zone 'Mars/Olympus'.*IANA"):
        load_zone("Mars/Olympus")


# --- DST: spring forward (local times that do not exist) ---------------------------------


@pytest.mark.parametrize(
    ("tz", "expr", "start", "gap_end", "skip_next"),
    [
        # New York 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC)
        (
            "America/New_York",
            "30 2 * * *",
            utc(2026, 3, 8),
            utc(2026, 3, 8, 7, 0),
            utc(2026, 3, 9, 6, 30),
        ),
        # Paris 2026-03-29: 02:00 CET -> 03:00 CEST (01:00 UTC)
        (
            "Europe/Paris",
            "30 2 * * *",
            utc(2026, 3, 28, 12),
            utc(2026, 3, 29, 1, 0),
            utc(2026, 3, 30, 0, 30),
        ),
        # Sydney 2026-10-04: 02:00 AEST -> 03:00 AEDT (2026-10-03 16:00 UTC)
        (
            "Australia/Sydney",
            "30 2 * * *",
            utc(2026, 10, 3, 0),
            utc(2026, 10, 3, 16, 0),
            utc(2026, 10, 4, 15, 30),
        ),
        # Lord Howe 2026-10-04: a 30-minute jump, 02:00 -> 02:30 (+10:30 -> +11, 15:30 UTC)
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            utc(2026, 10, 3, 0),
            utc(2026, 10, 3, 15, 30),
            utc(2026, 10, 4, 15, 15),
        ),
    ],
)
def test_spring_forward(
    tz: str, expr: str, start: datetime, gap_end: datetime, skip_next: datetime
) -> None:
    assert cron(expr, tz).next_after(start) == gap_end
    assert cron(expr, tz, spring=SpringForward.SKIP).next_after(start) == skip_next


def test_spring_forward_gap_times_merge_with_the_regular_run() -> None:
    """Every 15 min through the New York gap: 02:00-02:45 do not exist; run at gap end
    (03:00 EDT) once, not four times, under both policies."""
    start = utc(2026, 3, 8, 6, 30)  # 01:30 EST
    expected = [utc(2026, 3, 8, 6, 45), utc(2026, 3, 8, 7, 0), utc(2026, 3, 8, 7, 15)]
    assert take(cron("*/15 * * * *", "America/New_York"), start, 3) == expected
    assert (
        take(cron("*/15 * * * *", "America/New_York", spring=SpringForward.SKIP), start, 3)
        == expected
    )


# --- DST: fall back (local times that occur twice) ---------------------------------------


@pytest.mark.parametrize(
    ("tz", "expr", "start", "first", "second"),
    [
        # New York 2026-11-01: 02:00 EDT -> 01:00 EST; 01:30 is 05:30 and 06:30 UTC
        (
            "America/New_York",
            "30 1 * * *",
            utc(2026, 10, 31, 12),
            utc(2026, 11, 1, 5, 30),
            utc(2026, 11, 1, 6, 30),
        ),
        # Paris 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 is 00:30 and 01:30 UTC
        (
            "Europe/Paris",
            "30 2 * * *",
            utc(2026, 10, 24, 12),
            utc(2026, 10, 25, 0, 30),
            utc(2026, 10, 25, 1, 30),
        ),
        # Sydney 2026-04-05: 03:00 AEDT -> 02:00 AEST; 02:30 is 15:30 and 16:30 UTC (Apr 4)
        (
            "Australia/Sydney",
            "30 2 * * *",
            utc(2026, 4, 4, 0),
            utc(2026, 4, 4, 15, 30),
            utc(2026, 4, 4, 16, 30),
        ),
    ],
)
def test_fall_back(tz: str, expr: str, start: datetime, first: datetime, second: datetime) -> None:
    once = take(cron(expr, tz), start, 2)
    assert once[0] == first
    assert once[1] - first > timedelta(hours=20)  # the repeat is not run
    assert take(cron(expr, tz, fall=FallBack.RUN_TWICE), start, 2) == [first, second]


def test_hourly_through_fall_back() -> None:
    start = utc(2026, 11, 1, 4, 30)  # 00:30 EDT
    assert take(cron("0 * * * *", "America/New_York"), start, 2) == [
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 7),
    ]  # 01:00 EDT, 02:00 EST
    assert take(cron("0 * * * *", "America/New_York", fall=FallBack.RUN_TWICE), start, 3) == [
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 6),
        utc(2026, 11, 1, 7),
    ]


def test_run_twice_from_inside_the_first_pass() -> None:
    """Starting inside the first 01:xx hour, the second pass must still be found."""
    s = cron("45 1 * * *", "America/New_York", fall=FallBack.RUN_TWICE)
    assert s.next_after(utc(2026, 11, 1, 5, 50)) == utc(2026, 11, 1, 6, 45)


# --- properties --------------------------------------------------------------------------

_EXPRS = [
    "* * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "15 2 * * *",
    "30 1 * * *",
    "0 0 1 * *",
    "5 4 * * sun",
    "0 */3 * * *",
    "10,40 1-3 * * *",
    "*/20 * * * * *",
]
_ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Paris",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Santiago",
]
_instants = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
)


@settings(max_examples=200, deadline=None)
@given(expr=st.sampled_from(_EXPRS), t=_instants)
def test_utc_matches_croniter(expr: str, t: datetime) -> None:
    it = croniter(expr, t, second_at_beginning=len(expr.split()) == 6)
    assert cron(expr).next_after(t) == it.get_next(datetime)


@settings(max_examples=200, deadline=None)
@given(
    expr=st.sampled_from(_EXPRS),
    tz=st.sampled_from(_ZONES),
    t=_instants,
    spring=st.sampled_from(list(SpringForward)),
    fall=st.sampled_from(list(FallBack)),
)
def test_strictly_increasing_and_on_schedule(
    expr: str, tz: str, t: datetime, spring: SpringForward, fall: FallBack
) -> None:
    s = cron(expr, tz, spring, fall)
    seq = take(s, t, 5)
    assert seq[0] > t
    assert all(a < b for a, b in itertools.pairwise(seq))
    zone = load_zone(tz)
    for inst in seq:
        local = inst.astimezone(zone).replace(tzinfo=None)
        # on schedule, or the end of a DST gap that a scheduled local time fell into
        matches = croniter.match(expr, local, second_at_beginning=len(expr.split()) == 6)
        gap_end = (
            inst.astimezone(zone).utcoffset()
            != (inst - timedelta(hours=3)).astimezone(zone).utcoffset()
        )
        assert matches or (gap_end and spring == SpringForward.RUN_AT_GAP_END), (inst, local)


@settings(max_examples=100, deadline=None)
@given(tz=st.sampled_from(_ZONES), t=_instants)
def test_run_once_never_repeats_a_wall_clock_time(tz: str, t: datetime) -> None:
    s = cron("*/30 * * * *", tz)
    zone = load_zone(tz)
    walls = [i.astimezone(zone).replace(tzinfo=None) for i in take(s, t, 60)]
    assert len(walls) == len(set(walls))


# --- identity and jitter (invariant 5) ---------------------------------------------------


def test_key_format() -> None:
    job = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert schedule.occurrence_key(job, utc(2026, 1, 2, 3, 4, 5)) == (
        "12345678-1234-5678-1234-567812345678:2026-01-02T03:04:05Z"
    )


@given(job=st.uuids(), jitter=st.integers(min_value=1, max_value=3600), t=_instants)
def test_jitter_is_deterministic_bounded_and_never_changes_identity(
    job: uuid.UUID, jitter: int, t: datetime
) -> None:
    off = schedule.jitter_offset(job, jitter)
    assert off == schedule.jitter_offset(job, jitter)
    assert timedelta(0) <= off < timedelta(seconds=jitter)
    assert schedule.occurrence_key(job, t) == f"{job}:{schedule.format_instant(t)}"
    assert schedule.jitter_offset(job, 0) == timedelta(0)


def test_partition_is_stable_and_spread() -> None:
    ids = [uuid.uuid4() for _ in range(1600)]
    counts = [0] * 16
    for i in ids:
        p = schedule.partition_of(i, 16)
        assert p == schedule.partition_of(i, 16)
        counts[p] += 1
    assert min(counts) > 50
