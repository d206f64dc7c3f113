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


# --- issue 14: the examples, as regression tests ------------------------------------------


def local(zone: str, *a: int) -> datetime:
    return datetime(*a, tzinfo=load_zone(zone))  # type: ignore[arg-type,misc]


def test_a_gap_time_found_from_the_summer_offset_applies_the_policy() -> None:
    """From July, March 13th 02:30 New York: in 2016 it is in the gap (RunAtGapEnd: 03:00
    EDT; Skip: the 2017 instant, a Monday after the change)."""
    start = local("America/New_York", 2015, 7, 1)
    gap = cron("30 2 13 3 *", "America/New_York").next_after(start)
    assert gap == local("America/New_York", 2016, 3, 13, 3, 0)
    assert gap is not None and gap.astimezone(load_zone("America/New_York")).hour == 3
    skip = cron("30 2 13 3 *", "America/New_York", spring=SpringForward.SKIP).next_after(start)
    assert skip == datetime(2017, 3, 13, 6, 30, tzinfo=UTC)  # 02:30 EDT


def test_lord_howe_half_hour_gap() -> None:
    """Lord Howe 2017-10-01: 02:00 -> 02:30; 02:15 runs at the end of the gap, 02:30 +11."""
    got = cron("15 2 1 10 *", "Australia/Lord_Howe").next_after(
        local("Australia/Lord_Howe", 2017, 3, 1)
    )
    assert got == datetime(2017, 9, 30, 15, 30, tzinfo=UTC)  # 02:30+11:00


def firsts(expr: str, start: datetime, n: int, tz: str = "UTC") -> list[datetime]:
    return take(cron(expr, tz), start, n)


def test_wrap_around_ranges_with_steps() -> None:
    ny = "America/New_York"
    got = firsts("* 23-3/2 * * *", local(ny, 2026, 1, 15, 0, 30), 1, ny)
    assert got == [local(ny, 2026, 1, 15, 1, 0)]
    hours = {
        t.astimezone(load_zone(ny)).hour
        for t in firsts("0 23-3/2 * * *", local(ny, 2026, 1, 15), 6, ny)
    }
    assert hours == {23, 1, 3}
    assert [t.month for t in firsts("0 0 1 9-8/3 *", utc(2026, 1, 1), 4)] == [3, 6, 9, 12]
    # sat-tue/2: Saturday, Monday (2026-01-03 is a Saturday)
    assert [t.day for t in firsts("0 0 * * sat-tue/2", utc(2026, 1, 1), 4)] == [3, 5, 10, 12]
    assert {t.hour for t in firsts("0 20-5/5 * * *", utc(2026, 1, 1), 6)} == {20, 1}
    assert {t.minute for t in firsts("20-5/5 * * * *", utc(2026, 1, 1), 10)} == {
        20,
        25,
        30,
        35,
        40,
        45,
        50,
        55,
        0,
        5,
    }


def test_nearest_weekday_never_leaves_its_month() -> None:
    # 31W: months without a 31st are skipped; 2026-01-31 is a Saturday -> Friday 30th,
    # 2026-05-31 a Sunday -> Friday 29th (not Monday June 1st)
    assert [(t.month, t.day) for t in firsts("0 0 31W * *", utc(2026, 1, 1), 4)] == [
        (1, 30),
        (3, 31),
        (5, 29),
        (7, 31),
    ]
    # 30W: February is skipped (2026-03-30 is a Monday)
    assert [(t.month, t.day) for t in firsts("0 0 30W * *", utc(2026, 1, 1), 2)] == [
        (1, 30),
        (3, 30),
    ]
    # 1W on a Saturday (2026-08-01) is Monday the 3rd, not Friday July 31st
    assert firsts("0 0 1W 8 *", utc(2026, 1, 1), 1) == [utc(2026, 8, 3)]


def test_quartz_day_syntax() -> None:
    jan = utc(2026, 1, 1)
    assert firsts("0 0 L * *", jan, 2) == [utc(2026, 1, 31), utc(2026, 2, 28)]
    assert firsts("0 0 L-2 * *", jan, 2) == [utc(2026, 1, 29), utc(2026, 2, 26)]
    assert firsts("0 0 LW * *", jan, 2) == [utc(2026, 1, 30), utc(2026, 2, 27)]
    assert firsts("0 0 * * 5L", jan, 2) == [utc(2026, 1, 30), utc(2026, 2, 27)]  # last Friday
    assert firsts("0 0 * * L5", jan, 1) == [utc(2026, 1, 30)]  # croniter's spelling
    assert firsts("0 0 * * MON#2", jan, 2) == [utc(2026, 1, 12), utc(2026, 2, 9)]
    assert firsts("0 0 ? * 1#1", jan, 1) == [utc(2026, 1, 5)]


def test_day_of_month_or_day_of_week() -> None:
    # both restricted: either matches (Vixie cron, Kubernetes CronJob): the 13th or Fridays
    assert [t.day for t in firsts("0 0 13 * 5", utc(2026, 1, 1), 4)] == [2, 9, 13, 16]
    # one side unrestricted (* or ?): the other alone
    assert [t.day for t in firsts("0 0 * * 5", utc(2026, 1, 1), 2)] == [2, 9]
    assert [t.day for t in firsts("0 0 13 * ?", utc(2026, 1, 1), 2)] == [13, 13]
    # with #, L or W: both must match (the first day of the month that is a Monday)
    assert firsts("0 0 1-7 * MON#1", utc(2026, 1, 1), 1) == [utc(2026, 1, 5)]
    assert firsts("0 0 L * FRI", utc(2026, 1, 1), 1) == [utc(2026, 7, 31)]


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("0 0 30 2 *", "never fires: February has no 30th"),
        ("* * 31 4 *", "never fires: April has no 31st"),
        ("0 0 1 * SUN#2", "never fires: the 1st is never the 2nd Sunday"),
        ("0 0 1W * SUN", "never fires: the weekday nearest the 1st is never a Sunday"),
        ("0 0 31W 2 *", "never fires: February has no 31st"),
        ("0 0 30W 2 *", "never fires: February has no 30th"),
    ],
)
def test_never_firing_expressions_are_refused_in_one_line(expr: str, reason: str) -> None:
    from cronwell.loader import parse_document

    doc = {
        "apiVersion": "cronwell.dev/v1alpha1",
        "kind": "ScheduledJob",
        "metadata": {"name": "x"},
        "spec": {"schedule": expr, "target": {"log": {}}},
    }
    with pytest.raises(SpecError) as e:
        parse_document(doc, "job.yaml")
    msg = str(e.value)
    assert reason in msg and "spec.schedule" in msg and "\n" not in msg
    assert "Traceback" not in msg and "croniter" not in msg.lower()
    assert msg.endswith(("set one of the two day fields to ?", "or other months")), msg


def test_a_window_without_an_instant_is_refused() -> None:
    from pydantic import ValidationError

    from cronwell.models import ScheduledJobSpec

    with pytest.raises(ValidationError, match=r"never fires between spec\.startAt and spec\.endAt"):
        ScheduledJobSpec.model_validate(
            {
                "schedule": "0 0 1 1 *",
                "startAt": "2026-02-01T00:00:00Z",
                "endAt": "2026-12-01T00:00:00Z",
                "target": {"log": {}},
            }
        )


def test_random_fields_are_refused() -> None:
    with pytest.raises(SpecError, match="use H"):
        validate_cron("R * * * *")


def test_every_is_anchored_at_the_epoch_or_start_at() -> None:
    from cronwell.models import ScheduledJobSpec
    from cronwell.schedule import JobSchedule

    def sched(**kw: object) -> JobSchedule:
        s = ScheduledJobSpec.model_validate({"target": {"log": {}}, **kw})
        return JobSchedule.from_spec("j", s)

    every = sched(schedule="@every 1h30m", timeZone="America/New_York")
    # epoch + k * 90 min, whatever the zone: 2026-01-01 00:00Z is one of them (k = 327,264)
    assert every.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1, 1, 30)
    assert every.next_after(utc(2026, 1, 1, 0, 59)) == utc(2026, 1, 1, 1, 30)
    anchored = sched(schedule="@every 7m", startAt="2026-01-01T00:00:05Z")
    assert list(itertools.islice(anchored.iter_from(utc(2020, 1, 1)), 2)) == [
        utc(2026, 1, 1, 0, 0, 5),
        utc(2026, 1, 1, 0, 7, 5),
    ]
    for bad in ("@every", "@every 0s", "@every 5 minutes", "@every -5m"):
        with pytest.raises(SpecError, match="@every"):
            validate_cron(bad)


@settings(max_examples=100, deadline=None)
@given(
    job=st.uuids(),
    t=_instants,
    expr=st.sampled_from(
        [
            "H * * * *",
            "H H * * *",
            "H/15 * * * *",
            "H(0-29)/10 H * * *",
            "H H H * *",
            "H * * * * *",
            "H/20 H * * * *",
            "0 H(9-17) * * MON-FRI",
            "@hourly",
            "@daily",
        ]
    ),
)
def test_hashed_values_are_the_ones_croniter_gave(job: uuid.UUID, t: datetime, expr: str) -> None:
    """Jobs using H keep their instants (and so their keys) across the engine change."""
    six = len(expr.split()) == 6
    it = croniter(expr, t, hash_id=str(job).encode(), second_at_beginning=six)
    want = it.get_next(datetime)
    if expr.startswith("@"):  # cronwell never hashes macros (croniter does with a hash_id)
        want = croniter(expr, t).get_next(datetime)
    assert cron(expr, hash_id=str(job)).next_after(t) == want


# --- one engine: scheduler, forecast and backfill agree -----------------------------------


@settings(max_examples=30, deadline=None)
@given(
    expr=st.sampled_from(
        [
            "*/13 * * * *",
            "0 */2 * * *",
            "15,45 1-3 * * *",
            "*/20 * * * * *",
            "30 2 * * *",
            "0 0 L * *",
            "@every 25m",
        ]
    ),
    zone=st.sampled_from(
        [
            "UTC",
            "Europe/London",
            "America/New_York",
            "Australia/Lord_Howe",
            "Pacific/Chatham",
            "America/Santiago",
        ]
    ),
    policy=st.sampled_from([{}, {"springForward": "Skip"}, {"fallBack": "RunTwice"}]),
    start=st.sampled_from(
        [
            utc(2026, 3, 8, 5),
            utc(2026, 3, 29, 0),
            utc(2026, 10, 4, 14),
            utc(2026, 11, 1, 5),
            utc(2026, 4, 4, 2),
            utc(2026, 9, 5, 23),
        ]
    ),
    shift=st.integers(0, 7200 * 10**6),
)
def test_scheduler_forecast_and_backfill_agree(
    expr: str, zone: str, policy: dict[str, str], start: datetime, shift: int
) -> None:
    from cronwell.backfill import window_instants
    from cronwell.forecast import ForecastJob, demand
    from cronwell.models import MisfirePolicy, ScheduledJobSpec
    from cronwell.plan import plan_job
    from cronwell.schedule import JobSchedule

    spec = ScheduledJobSpec.model_validate(
        {"schedule": expr, "timeZone": zone, "dstPolicy": policy, "target": {"log": {}}}
    )
    sched = JobSchedule.from_spec("j", spec)
    lo = (start + timedelta(microseconds=shift)).replace(microsecond=0)
    hi = lo + timedelta(hours=4)
    # the scheduler: plans from its cursor (the first instant at or after lo) up to hi
    first = sched.first_at_or_after(lo)
    assert first is not None
    plan = plan_job(
        sched,
        first,
        now=hi,
        horizon=timedelta(0),
        deadline=timedelta(days=1),
        policy=MisfirePolicy.RUN_ALL,
        max_catchup=100_000,
        limit=100_000,
    )
    scheduled = [t for t in plan.run if t < hi]
    # backfill of [lo, hi - 1 µs], and the forecast's per-second counts of [lo, hi)
    backfilled = window_instants(sched, lo, hi - timedelta(microseconds=1), 100_000)
    pf = demand([ForecastJob.of("j", spec)], lo, 4 * 3600)["default"] if scheduled else None
    forecast = {i: c for i, c in enumerate(pf.counts) if c} if pf else {}
    assert scheduled == backfilled == sched.between(lo, hi)
    assert forecast == {int((t - lo).total_seconds()): 1 for t in scheduled}
    assert all(a < b for a, b in itertools.pairwise(scheduled))


@pytest.mark.parametrize(
    ("expr", "attr", "values"),
    [
        ("0 0 * * 1/2", "weekdays", {1, 3, 5}),  # a/n ends at Saturday, as CronJob and croniter
        ("0 0 * * 5-7", "weekdays", {5, 6, 0}),  # 7 is Sunday
        ("0 0 * * 0-7", "weekdays", set(range(7))),
        ("0 0 * * sat-tue/2", "weekdays", {6, 1}),
        ("0 0 * * FRI-MON", "weekdays", {5, 6, 0, 1}),
        ("0 0 * 9-8/3 *", "months", {9, 12, 3, 6}),
        ("0 0 * nov-feb *", "months", {11, 12, 1, 2}),
        ("0 23-3/2 * * *", "hours", {23, 1, 3}),
        ("0 20-5/5 * * *", "hours", {20, 1}),
        ("5-5 * * * *", "minutes", {5}),  # an equal range is its value (croniter: the hour)
        ("58/5 * * * *", "minutes", {58}),
        ("0 0 * * FRIL", "last_of", {5}),
        ("0 0 28-L * *", "days", {28, 29, 30, 31}),
    ],
)
def test_field_sets(expr: str, attr: str, values: set[int]) -> None:
    from cronwell.cronexpr import parse

    assert set(getattr(parse(expr), attr)) == values


@settings(max_examples=100, deadline=None)
@given(
    expr=st.sampled_from(["45 1 * * *", "*/20 * * * *", "30 2 * * *", "* 1 * * * *"]),
    tz=st.sampled_from(["America/New_York", "Australia/Lord_Howe", "America/Santiago"]),
    shown=st.sampled_from(["UTC", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe"]),
    t=st.sampled_from([utc(2026, 11, 1, 5, 50), utc(2026, 3, 8, 6, 40), utc(2026, 4, 4, 14),
                       utc(2026, 10, 3, 15, 10), utc(2026, 4, 5, 2, 30), utc(2026, 9, 6, 3, 30)]),
    spring=st.sampled_from(list(SpringForward)),
    fall=st.sampled_from(list(FallBack)),
)  # fmt: skip
def test_the_zone_t_is_given_in_does_not_matter(
    expr: str, tz: str, shown: str, t: datetime, spring: SpringForward, fall: FallBack
) -> None:
    s = cron(expr, tz, spring, fall)
    assert s.next_after(t.astimezone(load_zone(shown))) == s.next_after(t)


def test_a_schedule_whose_every_match_is_skipped_ends() -> None:
    """02:30 on New York's change day is always in the gap: with Skip it never runs, and
    the walk stops after LOOKAHEAD_YEARS instead of walking to year 9999."""
    ny = "America/New_York"
    assert cron("30 2 * 3 SUN#2", ny, spring=SpringForward.SKIP).next_after(utc(2026, 1, 1)) is None
    assert cron("30 2 * 3 SUN#2", ny).next_after(utc(2026, 1, 1)) == utc(2026, 3, 8, 7)


def test_lower_case_h_is_hashed_too_and_every_never_is() -> None:
    from cronwell.cronexpr import uses_hash

    assert uses_hash("h h * * *") and uses_hash("H(0-29)/10 * * * *")
    assert not uses_hash("@every 1h30m") and not uses_hash("@hourly")
    assert not uses_hash("0 0 * * thu") and not uses_hash("0 0 * mar *")


def test_remembered_answers_are_kept_by_instant_not_by_local_time() -> None:
    """A schedule keeps its last answers and keys spell cached instants: 01:30 at New
    York's first and second pass (fold 0 and 1) compare and hash alike as local times, yet
    are an hour apart, with their own next instants and keys."""
    first = datetime(2026, 11, 1, 1, 30, tzinfo=load_zone("America/New_York"))
    second = first.replace(fold=1)
    s = cron("*/20 * * * *", "America/New_York", fall=FallBack.RUN_TWICE)
    assert [s.next_after(first), s.next_after(second)] == [
        utc(2026, 11, 1, 5, 40),
        utc(2026, 11, 1, 6, 40),
    ]
    assert [schedule.format_instant(first), schedule.format_instant(second)] == [
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
    ]


def test_kept_answers_serve_equal_crons_and_stay_bounded() -> None:
    """Answers are kept by equal cron (another job's copy of the cron finds them) and the
    store of them never outgrows its size, whatever number of crons and instants ask."""
    schedule._ANSWERS.clear()
    t = utc(2026, 12, 7, 11)
    assert cron("*/5 * * * *").next_after(t) == utc(2026, 12, 7, 11, 5)
    assert len(schedule._ANSWERS) == 1
    assert cron("*/5 * * * *").next_after(t) == utc(2026, 12, 7, 11, 5)
    assert len(schedule._ANSWERS) == 1  # the copy's answer was the kept one
    assert cron("*/5 * * * *", hash_id="j").next_after(t) == utc(2026, 12, 7, 11, 5)
    assert len(schedule._ANSWERS) == 2  # H's seed makes another cron, even with no H
    for i in range(schedule._ANSWERS_SIZE + 10):
        cron("* * * * * *", hash_id=str(i % 7)).next_after(t + timedelta(seconds=i))
    assert 0 < len(schedule._ANSWERS) <= schedule._ANSWERS_SIZE
