"""The schedule engine against a brute-force reference written here, independently: random
cron expressions are generated together with their meaning (value sets, day rules), every
local wall-clock minute (second, for 6 fields) of a window is tested against that meaning,
and each match is mapped to UTC with zoneinfo by the DST policy's definition. The engine
must give the same first instant. Zones: DST in both hemispheres, 30- and 45-minute
offsets, a 30-minute DST shift, midnight transitions, a zone that dropped DST."""

from __future__ import annotations

import calendar
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwell.cronexpr import validate_cron
from cronwell.errors import SpecError
from cronwell.models import FallBack, SpringForward
from cronwell.schedule import CronSchedule

ZONES = [
    "Australia/Lord_Howe",  # +10:30/+11: a 30-minute DST shift
    "Pacific/Chatham",  # +12:45/+13:45
    "America/Santiago",  # southern, transitions at local midnight
    "Asia/Amman",  # DST until 2022, then permanent +03
    "America/New_York",
    "Europe/London",
]
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
BACK = timedelta(hours=2)
"""More than any offset change of these zones (1 h at most): how far before t local times
can map after t, and how far after the first match later local times can map before it."""


@functools.cache
def transitions(zone: str) -> list[datetime]:
    """UTC instants (to the hour) where the zone's offset changes, 2016-2027."""
    tz = ZoneInfo(zone)
    out, t = [], datetime(2016, 1, 1, tzinfo=UTC)
    prev = t.astimezone(tz).utcoffset()
    while t < datetime(2028, 1, 1, tzinfo=UTC):
        t += timedelta(minutes=15)
        off = t.astimezone(tz).utcoffset()
        if off != prev:
            out.append(t)
            prev = off
    return out


# ------------------------------------------------------------- expressions and meaning


def cyclic(a: int, b: int, step: int, lo: int, hi: int) -> set[int]:
    """a, a+step, ... up to b, walking one value at a time and wrapping from hi to lo."""
    out, x, k = set(), a, 0
    while True:
        if k % step == 0:
            out.add(x)
        if x == b:
            return out
        x = x + 1 if x < hi else lo
        k += 1


@st.composite
def numeric(
    draw: st.DrawFn, lo: int, hi: int, names: list[str] | None = None
) -> tuple[str, set[int]]:
    def show(v: int) -> str:
        if names and draw(st.booleans()):
            return names[v - lo].upper() if draw(st.booleans()) else names[v - lo]
        return str(v)

    v = st.integers(lo, hi)
    kind = draw(st.sampled_from(["star", "step", "one", "list", "range", "rstep", "from"]))
    if kind == "star":
        return "*", set(range(lo, hi + 1))
    if kind == "step":
        n = draw(st.integers(1, hi - lo + 1))
        return f"*/{n}", cyclic(lo, hi, n, lo, hi)
    if kind == "one":
        x = draw(v)
        return show(x), {x}
    if kind == "list":
        xs = draw(st.lists(v, min_size=1, max_size=4))
        return ",".join(show(x) for x in xs), set(xs)
    a, b, n = draw(v), draw(v), draw(st.integers(1, hi - lo + 1))
    if kind == "range":
        return f"{show(a)}-{show(b)}", cyclic(a, b, 1, lo, hi)
    if kind == "rstep":
        return f"{show(a)}-{show(b)}/{n}", cyclic(a, b, n, lo, hi)
    return f"{show(a)}/{n}", cyclic(a, hi, n, lo, hi)


@functools.cache
def nearest_weekday(y: int, m: int, n: int) -> int | None:
    """The Monday-Friday of the month closest to day n; None if the month has no day n."""
    length = calendar.monthrange(y, m)[1]
    if n > length:
        return None
    weekdays = [d for d in range(1, length + 1) if date(y, m, d).weekday() < 5]
    return min(weekdays, key=lambda d: abs(d - n))


@functools.cache
def last_weekday(y: int, m: int) -> int:
    length = calendar.monthrange(y, m)[1]
    return max(x for x in range(1, length + 1) if date(y, m, x).weekday() < 5)


DayRule = Callable[[date], bool]


@st.composite
def dom_field(draw: st.DrawFn) -> tuple[str, DayRule | None, bool]:
    """(text, rule or None for unrestricted, uses L/W)."""
    kind = draw(st.sampled_from(["star", "star", "q", "num", "L", "L-n", "LW", "nW"]))
    last = lambda d: calendar.monthrange(d.year, d.month)[1]  # noqa: E731
    if kind == "star":
        return "*", None, False
    if kind == "q":
        return "?", None, False
    if kind == "num":
        text, vals = draw(numeric(1, 31))
        if text in ("*", "*/1"):  # unrestricted, as Kubernetes CronJob reads it
            return text, None, False
        return text, (lambda d: d.day in vals), False
    if kind == "L":
        return "L", (lambda d: d.day == last(d)), True
    if kind == "L-n":
        n = draw(st.integers(0, 30))
        return f"L-{n}", (lambda d: d.day == last(d) - n), True
    if kind == "LW":
        return "LW", (lambda d: d.day == last_weekday(d.year, d.month)), True
    n = draw(st.integers(1, 31))
    return f"{n}W", (lambda d: nearest_weekday(d.year, d.month, n) == d.day), True


def cron_wd(d: date) -> int:
    return (d.weekday() + 1) % 7


@st.composite
def dow_field(draw: st.DrawFn) -> tuple[str, DayRule | None, bool]:
    kind = draw(st.sampled_from(["star", "star", "q", "num", "seven", "nth", "last"]))
    if kind == "star":
        return "*", None, False
    if kind == "q":
        return "?", None, False
    if kind == "num":
        text, vals = draw(numeric(0, 6, DAYS))
        if text in ("*", "*/1"):
            return text, None, False
        return text, (lambda d: cron_wd(d) in vals), False
    if kind == "seven":
        return "7", (lambda d: cron_wd(d) == 0), False
    wd = draw(st.integers(0, 6))
    name = draw(st.sampled_from([str(wd), DAYS[wd].upper()]))
    if kind == "nth":
        k = draw(st.integers(1, 5))
        return f"{name}#{k}", (lambda d: cron_wd(d) == wd and (d.day - 1) // 7 + 1 == k), True
    return (
        f"{wd}L",
        (lambda d: cron_wd(d) == wd and d.day + 7 > calendar.monthrange(d.year, d.month)[1]),
        True,
    )


@dataclass
class Expr:
    text: str
    seconds: set[int]
    minutes: set[int]
    hours: set[int]
    months: set[int]
    day: DayRule

    def matches(self, t: datetime) -> bool:
        return (
            t.second in self.seconds
            and t.minute in self.minutes
            and t.hour in self.hours
            and t.month in self.months
            and self.day(t.date())
        )


@st.composite
def expressions(draw: st.DrawFn, six: bool) -> Expr:
    sec_text, secs = draw(numeric(0, 59)) if six else ("", {0})
    min_text, mins = draw(numeric(0, 59))
    # hours when these zones change offset (23:00-03:00), often alone: gap and repeat times
    night = st.lists(st.sampled_from([23, 0, 1, 2, 3]), min_size=1, max_size=2, unique=True)
    hour_text, hours = draw(
        st.one_of(numeric(0, 23), night.map(lambda hs: (",".join(map(str, hs)), set(hs))))
    )
    mon_text, months = draw(st.one_of(st.just(("*", set(range(1, 13)))), numeric(1, 12, MONTHS)))
    dom_text, dom, dom_special = draw(dom_field())
    dow_text, dow, dow_special = draw(dow_field())
    if dom is None and dow is None:
        day: DayRule = lambda d: True  # noqa: E731
    elif dom is None:
        day = dow  # type: ignore[assignment]
    elif dow is None:
        day = dom
    elif dom_special or dow_special:  # both restricted, Quartz syntax: both must match
        day = lambda d: dom(d) and dow(d)  # noqa: E731
    else:  # both restricted: either (Vixie cron, Kubernetes CronJob)
        day = lambda d: dom(d) or dow(d)  # noqa: E731
    text = " ".join(x for x in (sec_text, min_text, hour_text, dom_text, mon_text, dow_text) if x)
    return Expr(text, secs, mins, hours, months, functools.cache(day))


# --------------------------------------------------------------- the reference walk


def exists(local: datetime, tz: ZoneInfo, fold: int) -> datetime | None:
    inst = local.replace(tzinfo=tz, fold=fold).astimezone(UTC)
    return inst if inst.astimezone(tz).replace(tzinfo=None) == local else None


def instants_of(
    local: datetime, tz: ZoneInfo, spring: SpringForward, fall: FallBack
) -> set[datetime]:
    """The DST policy, by its definition."""
    both = {i for i in (exists(local, tz, 0), exists(local, tz, 1)) if i is not None}
    if len(both) == 2:  # the wall clock shows this time twice
        return both if fall == FallBack.RUN_TWICE else {min(both)}
    if both:
        return both
    if spring == SpringForward.SKIP:  # not shown at all: skipped by the clock
        return set()
    # the end of the gap: the first wall time that exists again (found by the minute, then
    # walked back by the second)
    later = local.replace(second=0) + timedelta(minutes=1)
    while not (exists(later, tz, 0) or exists(later, tz, 1)):
        later += timedelta(minutes=1)
    while exists(later - timedelta(seconds=1), tz, 0) or exists(
        later - timedelta(seconds=1), tz, 1
    ):
        later -= timedelta(seconds=1)
    inst = exists(later, tz, 0) or exists(later, tz, 1)
    assert inst is not None
    return {inst}


def reference(
    e: Expr,
    tz: ZoneInfo,
    spring: SpringForward,
    fall: FallBack,
    t: datetime,
    span: timedelta,
    step: timedelta,
) -> tuple[list[datetime], datetime]:
    """(every instant in (t, covered], in order; covered: the end of the range the walk
    covers exactly, as local times up to BACK before wall(t) can map after t)."""
    wall = t.astimezone(tz).replace(tzinfo=None, microsecond=0, fold=0)
    if step == timedelta(minutes=1):
        wall = wall.replace(second=0)
    local, end = wall - BACK, wall + span
    covered = t + span - BACK
    found: set[datetime] = set()
    while local <= end:
        if e.matches(local):
            found |= {i for i in instants_of(local, tz, spring, fall) if t < i <= covered}
        local += step
    return sorted(found), covered


def starts(zone: str) -> st.SearchStrategy[datetime]:
    """Just before a transition of the zone (up to 2 h), near one (+-1 day), or anywhere
    in 2016-2027."""

    def around(lo: int, hi: int) -> st.SearchStrategy[datetime]:
        return st.tuples(
            st.sampled_from(transitions(zone)), st.integers(lo, hi), st.integers(0, 999999)
        ).map(lambda x: x[0] + timedelta(seconds=x[1], microseconds=x[2]))

    anywhere = st.datetimes(datetime(2016, 1, 1), datetime(2027, 12, 1), timezones=st.just(UTC))
    return st.one_of(around(-7200, 600), around(-86400, 86400), anywhere)


def check(
    e: Expr,
    zone: str,
    spring: SpringForward,
    fall: FallBack,
    t: datetime,
    span: timedelta,
    step: timedelta,
) -> None:
    try:
        validate_cron(e.text)
    except SpecError as err:
        assert "never fires" in str(err), err
        # refused as never firing: no day of 28 years of its months matches
        d = date(2024, 1, 1)
        while d < date(2052, 1, 1):
            assert not (d.month in e.months and e.day(d)), (e.text, d)
            d += timedelta(days=1)
        return
    tz = ZoneInfo(zone)
    want, covered = reference(e, tz, spring, fall, t, span, step)
    sched = CronSchedule(e.text, tz, spring, fall)
    got, nxt = [], sched.next_after(t)
    while nxt is not None and nxt <= covered:
        got.append(nxt)
        nxt = sched.next_after(nxt)
    assert got == want, (e.text, zone, t)


@pytest.mark.parametrize("zone", ZONES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    spring=st.sampled_from(list(SpringForward)),
    fall=st.sampled_from(list(FallBack)),
)
def test_five_fields_match_the_reference(
    zone: str, data: st.DataObject, spring: SpringForward, fall: FallBack
) -> None:
    e = data.draw(expressions(six=False))
    t = data.draw(starts(zone))
    check(e, zone, spring, fall, t, timedelta(days=2), timedelta(minutes=1))


@pytest.mark.parametrize("zone", ZONES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    spring=st.sampled_from(list(SpringForward)),
    fall=st.sampled_from(list(FallBack)),
)
def test_six_fields_match_the_reference(
    zone: str, data: st.DataObject, spring: SpringForward, fall: FallBack
) -> None:
    e = data.draw(expressions(six=True))
    t = data.draw(starts(zone))
    check(e, zone, spring, fall, t, timedelta(hours=4), timedelta(seconds=1))
