"""Cron expressions and time zones: parsed once into field sets, validated (syntax, and
whether the expression can ever fire), cached. `schedule` walks the sets; nothing here
knows about instants or DST.

Syntax (the README's schedule reference states it as one table): 5 fields (minute hour
day-of-month month day-of-week) or 6 with seconds first; `*`, `?` (day fields), values and
names, `a-b` (wrapping when a > b), `/n` steps, lists; `H` forms hashed from the job uid
(the same values croniter gave, so existing jobs keep their instants); day-of-month `L`,
`L-n`, `LW`, `nW`; day-of-week `n#k`, `nL` (also croniter's `Ln`); macros; `@every`.
"""

from __future__ import annotations

import binascii
import calendar
import functools
import re
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronwell.errors import SpecError

_FIELD = "spec.schedule"

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# name, lowest, highest, croniter's field index (it seeds H, so hashed values stay put)
_SECOND = ("second", 0, 59, 5)
_MINUTE = ("minute", 0, 59, 0)
_HOUR = ("hour", 0, 23, 1)
_DOM = ("day-of-month", 1, 31, 2)
_MONTH = ("month", 1, 12, 3)
_DOW = ("day-of-week", 0, 7, 4)
_FieldDef = tuple[str, int, int, int]

# English names whatever the locale (calendar's names follow LC_TIME); the dashboard's
# schedules in words (cronwell/ui/words.py) use them too
MONTH_FULL = ["", "January", "February", "March", "April", "May", "June", "July", "August",
               "September", "October", "November", "December"]  # fmt: skip
MONTH_NAMES = {m[:3].lower(): i for i, m in enumerate(MONTH_FULL) if m}
DAY_FULL = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
DAY_NAMES = {d[:3].lower(): i for i, d in enumerate(DAY_FULL)}

_HASH = re.compile(r"^h(?:\((\d+)-(\d+)\))?(?:/(\d+))?$")
_EVERY = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_HASHED = re.compile(r"(?<![A-Za-z])H(?![A-Za-z])", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def load_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise SpecError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Paris' or 'UTC'",
            field="spec.timeZone",
        ) from e


def uses_hash(expr: str) -> bool:
    """True if the cron has an `H` field (any case), so its instants depend on the job uid;
    macros and `@every` never do."""
    return not expr.lstrip().startswith("@") and bool(_HASHED.search(expr))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Every:
    """`@every DURATION`: instants anchor + k * seconds (anchor: startAt, else the epoch)."""

    seconds: int


@dataclass(frozen=True, eq=False)
class Cron:
    """One cron expression as field sets (sorted tuples), plus the day-of-month and
    day-of-week rules, which need the month's length and weekday to become days."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    dom_star: bool
    dow_star: bool
    days: frozenset[int] = frozenset()
    """Plain days of the month (1-31)."""
    last_minus: frozenset[int] = frozenset()
    """`L-n` (and `L`, n = 0): the n-th day before the month's last."""
    last_weekday: bool = False
    """`LW`: the month's last weekday (Monday-Friday)."""
    nearest: frozenset[int] = frozenset()
    """`nW`: the weekday nearest day n, in the same month; none if the month has no day n."""
    weekdays: frozenset[int] = frozenset()
    """Plain days of the week, 0 = Sunday."""
    nth: frozenset[tuple[int, int]] = frozenset()
    """`d#k`: the k-th weekday d of the month."""
    last_of: frozenset[int] = frozenset()
    """`dL`: the last weekday d of the month."""
    both: bool = False
    """Day-of-month AND day-of-week must match (both restricted and one uses #, L or W)."""
    _tables: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)

    def days_of(self, length: int, first: int) -> frozenset[int]:
        """Matching days of a month of `length` days whose 1st is weekday `first` (0 = Sun)."""
        if self.dom_star and self.dow_star:
            return frozenset(range(1, length + 1))
        dom: set[int] = set()
        if not self.dom_star:
            dom = {d for d in self.days if d <= length}
            dom |= {length - n for n in self.last_minus if length - n >= 1}
            if self.last_weekday:
                wd = (first + length - 1) % 7
                dom.add(length - (1 if wd == 6 else 2 if wd == 0 else 0))
            for n in self.nearest:
                if n <= length:
                    wd = (first + n - 1) % 7
                    if wd == 6:  # Saturday: Friday before, or Monday after the 1st
                        dom.add(n - 1 if n > 1 else n + 2)
                    elif wd == 0:  # Sunday: Monday after, or Friday before the last day
                        dom.add(n + 1 if n < length else n - 2)
                    else:
                        dom.add(n)
        dow: set[int] = set()
        if not self.dow_star:
            dow = {d for d in range(1, length + 1) if (first + d - 1) % 7 in self.weekdays}
            for wd, k in self.nth:
                d = 1 + (wd - first) % 7 + 7 * (k - 1)
                if d <= length:
                    dow.add(d)
            for wd in self.last_of:
                dow.add(length - ((first + length - 1) - wd) % 7)
        if self.dom_star:
            return frozenset(dow)
        if self.dow_star:
            return frozenset(dom)
        return frozenset(dom & dow if self.both else dom | dow)

    def day_table(self, length: int, first: int) -> tuple[int, ...]:
        """t[d] = the first matching day >= d (0: none left), for d in 0..32."""
        key = (length, first)
        t = self._tables.get(key)
        if t is None:
            ok = self.days_of(length, first)
            out = [0] * 33
            nxt = 0
            for d in range(32, -1, -1):
                if d in ok:
                    nxt = d
                out[d] = nxt
            t = self._tables[key] = tuple(out)
        return t

    def per_day(self) -> int:
        """Runs on a day it runs."""
        return len(self.seconds) * len(self.minutes) * len(self.hours)


def _next_table(values: tuple[int, ...], size: int) -> tuple[int, ...]:
    """t[v] = the first value >= v, or -1; for v in 0..size."""
    out = [-1] * (size + 1)
    nxt = -1
    for v in range(size, -1, -1):
        if v in values:
            nxt = v
        out[v] = nxt
    return tuple(out)


class _Bad(Exception):
    """A field problem; turned into a SpecError naming the expression."""


def _number(tok: str, f: _FieldDef) -> int:
    name, lo, hi, _ = f
    if tok.isdigit():
        v = int(tok)
    elif f is _MONTH and tok in MONTH_NAMES:
        v = MONTH_NAMES[tok]
    elif f is _DOW and tok in DAY_NAMES:
        v = DAY_NAMES[tok]
    else:
        raise _Bad(f"{name} value {tok!r} is not a number" + _names_hint(f))
    if not lo <= v <= hi:
        raise _Bad(f"{name} value {v} is out of range {lo}-{hi}")
    return v


def _names_hint(f: _FieldDef) -> str:
    if f is _MONTH:
        return " (or jan-dec)"
    if f is _DOW:
        return " (or sun-sat)"
    return ""


def _span(lo: int, hi: int, step: int, f: _FieldDef) -> list[int]:
    """lo..hi by step; when lo > hi the range wraps past the field's end (23-3/2 in hours:
    23, 1, 3)."""
    first, last = f[1], f[2]
    if f is _DOW:
        last = 6
        if lo == 7:
            lo = 0
        if hi == 7 and lo <= 6:
            return sorted({v % 7 for v in range(lo, 8, step)})
    if lo <= hi:
        return list(range(lo, hi + 1, step))
    cycle = last - first + 1
    return sorted({v if v <= last else v - cycle for v in range(lo, hi + cycle + 1, step)})


def _hashed(tok: str, f: _FieldDef, crc: int) -> list[int] | None:
    """croniter's H: ((crc32(uid) >> field index) % width) + low."""
    m = _HASH.match(tok)
    if m is None:
        return None
    name, lo, hi, idx = f
    if f is _DOW:
        hi = 6
    a, b, step = m.group(1), m.group(2), m.group(3)
    if a is not None and b is not None:
        rlo, rhi = int(a), int(b)
        if rlo >= rhi:
            raise _Bad(f"{name} H({rlo}-{rhi}): the range end must be greater than its start")
        if not (lo <= rlo <= f[2] and lo <= rhi <= f[2]):
            raise _Bad(f"{name} H({rlo}-{rhi}) is out of range {lo}-{hi}")
    else:
        rlo, rhi = lo, hi
    if step is not None:
        n = int(step)
        if n == 0:
            raise _Bad(f"{name} step 0: use a step of at least 1")
        x = ((crc >> idx) % (min(rlo + n - 1, rhi) - rlo + 1)) + rlo
        return [v % 7 if f is _DOW else v for v in range(x, rhi + 1, n)]
    v = ((crc >> idx) % (rhi - rlo + 1)) + rlo
    return [v % 7 if f is _DOW else v]


def _plain(tok: str, f: _FieldDef, crc: int) -> list[int]:
    """Values of one list element: `*`, `*/n`, `a`, `a-b`, `a-b/n`, `a/n`, H forms."""
    name, lo, hi, _ = f
    h = _hashed(tok, f, crc)
    if h is not None:
        return h
    body, _, step_s = tok.partition("/")
    step = 1
    if step_s:
        if not step_s.isdigit() or int(step_s) == 0:
            raise _Bad(f"{name} step {step_s!r}: use a whole number of at least 1")
        step = int(step_s)
    if body == "*":
        return _span(lo, 6 if f is _DOW else hi, step, f)
    a, dash, b = body.partition("-")
    if not dash:
        start = _number(a, f)
        if not step_s:
            return [start % 7 if f is _DOW else start]
        return _span(start, 6 if f is _DOW else hi, step, f)  # a/n: from a to the end
    if f is _DOM and b == "l":
        return _span(_number(a, f), 31, step, f)
    return _span(_number(a, f), _number(b, f), step, f)


def _star(text: str) -> bool:
    """Unrestricted as Kubernetes CronJob (robfig/cron) reads it: `*`, `?` or `*/1`."""
    return text in ("*", "?", "*/1")


def _field(text: str, f: _FieldDef, crc: int) -> tuple[int, ...]:
    if text == "?":
        raise _Bad(f"'?' is only allowed in the day-of-month and day-of-week fields, not {f[0]}")
    out: set[int] = set()
    for tok in text.split(","):
        if not tok:
            raise _Bad(f"{f[0]} field {text!r} has an empty list element")
        out.update(_plain(tok, f, crc))
    return tuple(sorted(out))


def _parse_dom(text: str, crc: int, c: dict[str, object]) -> None:
    if text in ("*", "?"):
        return
    days: set[int] = set()
    last_minus: set[int] = set()
    nearest: set[int] = set()
    special = False
    for tok in text.split(","):
        if tok == "l":
            last_minus.add(0)
            special = True
        elif tok.startswith("l-") and tok[2:].isdigit():
            n = int(tok[2:])
            if not 0 <= n <= 30:
                raise _Bad(f"day-of-month L-{n}: n must be 0-30")
            last_minus.add(n)
            special = True
        elif tok == "lw":
            c["last_weekday"] = True
            special = True
        elif re.fullmatch(r"\d+w|w\d+", tok):
            n = int(tok.strip("w"))
            if not 1 <= n <= 31:
                raise _Bad(f"day-of-month {n}W: the day must be 1-31")
            nearest.add(n)
            special = True
        elif tok:
            days.update(_plain(tok, _DOM, crc))
        else:
            raise _Bad(f"day-of-month field {text!r} has an empty list element")
    c.update(days=frozenset(days), last_minus=frozenset(last_minus), nearest=frozenset(nearest))
    c["special"] = bool(c.get("special")) or special


def _parse_dow(text: str, crc: int, c: dict[str, object]) -> None:
    if text in ("*", "?"):
        return
    weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last_of: set[int] = set()
    special = False
    for tok in text.split(","):
        if "#" in tok:
            days_s, _, k_s = tok.partition("#")
            if not k_s.isdigit() or not 1 <= int(k_s) <= 5:
                raise _Bad(f"day-of-week {tok!r}: the # count must be 1-5 (e.g. MON#2)")
            for d in _plain(days_s, _DOW, crc):
                nth.add((d, int(k_s)))
            special = True
        elif len(tok) > 1 and tok.endswith("l"):
            last_of.add(_number(tok[:-1], _DOW) % 7)  # 5L: the last Friday (Quartz)
            special = True
        elif len(tok) > 1 and tok.startswith("l"):
            last_of.add(_number(tok[1:], _DOW) % 7)  # L5: croniter's spelling
            special = True
        elif tok:
            weekdays.update(_plain(tok, _DOW, crc))
        else:
            raise _Bad(f"day-of-week field {text!r} has an empty list element")
    c.update(weekdays=frozenset(weekdays), nth=frozenset(nth), last_of=frozenset(last_of))
    c["special"] = bool(c.get("special")) or special


def _parse(expr: str, hash_id: str) -> Cron:
    text = MACROS.get(expr.lower(), expr)
    parts = text.lower().split()
    if len(parts) not in (5, 6):
        raise SpecError(
            f"cron {expr!r} has {len(parts)} fields: use 5 (minute hour day-of-month month "
            "day-of-week) or 6 with seconds first",
            field=_FIELD,
        )
    if len(parts) == 5:
        parts.insert(0, "0")
    if any(re.fullmatch(r"r(\(\d+-\d+\))?(/\d+)?", p) for p in parts):
        raise SpecError(
            f"cron {expr!r}: R (random) is not supported, as a random instant would change "
            "the occurrence's key: use H for a stable per-job value",
            field=_FIELD,
        )
    crc = binascii.crc32(hash_id.encode()) & 0xFFFFFFFF
    sec, minute, hour, dom, month, dow = parts
    try:
        c: dict[str, object] = {}
        _parse_dom(dom, crc, c)
        _parse_dow(dow, crc, c)
        special = bool(c.pop("special", False))
        return Cron(
            text=expr,
            seconds=_field(sec, _SECOND, crc),
            minutes=_field(minute, _MINUTE, crc),
            hours=_field(hour, _HOUR, crc),
            months=_field(month, _MONTH, crc),
            dom_star=_star(dom),
            dow_star=_star(dow),
            both=special and not _star(dom) and not _star(dow),
            **c,  # type: ignore[arg-type]
        )
    except _Bad as e:
        raise SpecError(f"cron {expr!r} does not parse: {e}", field=_FIELD) from None


def _never_fires(c: Cron) -> tuple[str, str] | None:
    """Why no day of any allowed month ever matches, or None. Exact: a month's matching
    days depend only on its length and the weekday of its 1st, and every (month, length,
    weekday) combination recurs within 28 years (40 across a century's skipped leap day)."""
    for m in c.months:
        for length in (28, 29) if m == 2 else (calendar.monthrange(2001, m)[1],):
            if any(c.days_of(length, first) for first in range(7)):
                return None
    months = [MONTH_FULL[m] for m in c.months]
    if c.both:
        return (
            f"{join_words(_dom_words(c), 'or')} is never {join_words(_dow_words(c), 'or')}"
            " (with #, L or W, day-of-month and day-of-week must both match)",
            "set one of the two day fields to ?",
        )
    missing = [_ordinal(d) for d in sorted(c.days | c.nearest)] or _dom_words(c)
    has = "has" if len(months) == 1 else "have"
    return (
        f"{join_words(months, 'and')} {has} no {join_words(missing, 'or')}",
        "use a day every chosen month has (L is the last day), or other months",
    )


def join_words(xs: list[str], word: str) -> str:
    """`a`, `a and b`, `a, b and c` (with `word` for "and"): errors and the dashboard."""
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + f" {word} " + xs[-1]


def _dom_words(c: Cron) -> list[str]:
    words = [f"the {_ordinal(d)}" for d in sorted(c.days)]
    words += [f"the weekday nearest the {_ordinal(n)}" for n in sorted(c.nearest)]
    words += ["the last day" if n == 0 else f"L-{n}" for n in sorted(c.last_minus)]
    return words + (["the last weekday"] if c.last_weekday else [])


def _dow_words(c: Cron) -> list[str]:
    words = [f"a {DAY_FULL[d]}" for d in sorted(c.weekdays)]
    words += [f"the {_ordinal(k)} {DAY_FULL[d]}" for d, k in sorted(c.nth)]
    return words + [f"the last {DAY_FULL[d]}" for d in sorted(c.last_of)]


def _parse_every(expr: str) -> Every:
    dur = expr[len("@every") :].strip().lower()
    m = _EVERY.match(dur)
    if not dur or m is None:
        raise SpecError(
            f"cron {expr!r}: @every needs a duration such as 90s, 15m, 1h30m or 2d",
            field=_FIELD,
        )
    d, h, mi, s = (int(x or 0) for x in m.groups())
    seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds < 1:
        raise SpecError(f"cron {expr!r}: @every needs at least 1s", field=_FIELD)
    return Every(seconds)


@functools.lru_cache(maxsize=4096)
def parse(expr: str, hash_id: str = "") -> Cron | Every:
    """The parsed schedule; SpecError (one line: what is wrong, and the fix) otherwise.
    `hash_id` (the job uid) seeds `H` fields."""
    stripped = expr.strip()
    low = stripped.lower()
    if low.startswith("@every"):
        return _parse_every(stripped)
    if stripped.startswith("@") and low not in MACROS:
        raise SpecError(
            f"unknown cron macro {stripped!r}: use one of {', '.join(sorted(MACROS))} "
            "or @every DURATION",
            field=_FIELD,
        )
    return _parse(stripped, hash_id)


@functools.lru_cache(maxsize=4096)
def validate_cron(expr: str) -> None:
    """Raise SpecError with the fix unless `expr` parses and can fire."""
    c = parse(expr, "validate")
    if isinstance(c, Every):
        return
    never = _never_fires(c)
    if never is not None:
        reason, fix = never
        raise SpecError(f"cron {expr.strip()!r} never fires: {reason}: {fix}", field=_FIELD)


def runs_per_hour(expr: str) -> float:
    """Runs per hour on a day the schedule runs (`@every`: 3600 / its period)."""
    c = parse(expr, "rate")
    if isinstance(c, Every):
        return 3600 / c.seconds
    return c.per_day() / 24
