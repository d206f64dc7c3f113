"""A cron schedule in words for the dashboard ("every 5 minutes", "at 02:00 on Monday").

Pure and small on purpose: it covers the shapes people write (steps, fixed times, day and
month lists and ranges, macros, `@every`) and answers None for the rest (`H`, `L`, `W`,
`#`, lists of times), where the cron itself is clearer than a paraphrase. cron-descriptor
does not know cronwell's `H` forms or `@every`, so it would mis-describe those.
"""

from __future__ import annotations

import re

from cronwell.cronexpr import (
    DAY_FULL,
    DAY_NAMES,
    MACROS,
    MONTH_FULL,
    MONTH_NAMES,
    Every,
    join_words,
    parse,
    uses_hash,
)
from cronwell.errors import SpecError

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))
_NUM = re.compile(r"^\d+$")
_STEP = re.compile(r"^(?:\*|0)/(\d+)$")


class _Unsaid(Exception):
    """A field this module does not put into words."""


def _plural(n: int, unit: str) -> str:
    return f"{unit}" if n == 1 else f"{n} {unit}s"


def _every(expr: str) -> str | None:
    """`@every DURATION` (parsed by the scheduler's own cronexpr) as words."""
    try:
        every = parse(expr)
    except SpecError:
        return None
    if not isinstance(every, Every):
        return None
    secs, parts = every.seconds, []
    for unit, size in _UNITS:
        n, secs = divmod(secs, size)
        if n:
            parts.append(f"{n} {unit}" + ("s" if n > 1 else ""))
    if len(parts) == 1 and parts[0].startswith("1 "):
        return "every " + parts[0][2:]
    return "every " + " ".join(parts)


def _value(tok: str, names: dict[str, int]) -> int:
    tok = tok.lower()
    if tok in names:
        return names[tok]
    if not _NUM.match(tok):
        raise _Unsaid(tok)
    return int(tok)


def _list(text: str, names: dict[str, int], label: list[str], offset: int) -> str:
    """A list of values and ranges (`mon-fri`, `1,15`, `jan,jul`) as words."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = _value(lo, names), _value(hi, names)
            out.append(f"{label[a % len(label) - offset]} through {label[b % len(label) - offset]}")
        else:
            out.append(label[_value(part, names) % len(label) - offset])
    return join_words(out, "and")


def _days(dom: str, month: str, dow: str) -> str:
    """The day qualifiers: " on Monday", " on day 1 of the month", " in January"."""
    text = ""
    if dow not in ("*", "?"):
        if any(c in dow for c in "#L/"):
            raise _Unsaid(dow)
        text += " on " + _list(dow, DAY_NAMES, DAY_FULL, 0)
    if dom not in ("*", "?"):
        if not all(_NUM.match(p) for p in dom.split(",")):
            raise _Unsaid(dom)
        days = [int(p) for p in dom.split(",")]
        text += (" and" if text else "") + " on day " + ", ".join(map(str, days))
        text += " of the month"
    if month != "*":
        if "/" in month:
            raise _Unsaid(month)
        text += " in " + _list(month, MONTH_NAMES, MONTH_FULL[1:], 1)
    return text


def _time(sec: str, minute: str, hour: str) -> str:
    """The time-of-day part, from the seconds, minute and hour fields."""
    if sec == "*":
        if minute == "*" and hour == "*":
            return "every second"
        raise _Unsaid(sec)
    if m := _STEP.match(sec):
        if minute == "*" and hour == "*":
            return "every " + _plural(int(m.group(1)), "second")
        raise _Unsaid(sec)
    if not _NUM.match(sec):
        raise _Unsaid(sec)
    s = int(sec)
    if minute == "*" and hour == "*":
        return "every minute" + (f" at second {s}" if s else "")
    if m := _STEP.match(minute):
        if s:
            raise _Unsaid(sec)
        every = "every " + _plural(int(m.group(1)), "minute")
        if hour == "*":
            return every
        if re.match(r"^\d+-\d+$", hour):
            lo, hi = (int(x) for x in hour.split("-"))
            return f"{every} from {lo:02d}:00 to {hi:02d}:59"
        raise _Unsaid(hour)
    if not _NUM.match(minute):
        raise _Unsaid(minute)
    mi = int(minute)
    if hour == "*":
        return "every hour" + (f" at minute {mi}" if mi else "") + (f", second {s}" if s else "")
    if m := _STEP.match(hour):
        return f"every {_plural(int(m.group(1)), 'hour')} at minute {mi}"
    if not _NUM.match(hour):
        raise _Unsaid(hour)
    return f"at {int(hour):02d}:{mi:02d}" + (f":{s:02d}" if s else "")


def describe(expr: str) -> str | None:
    """`expr` (a cronwell cron: 5 fields, or 6 with seconds first; macros; `@every`) in
    words, or None when it has a form this module leaves to the cron itself."""
    text = expr.strip()
    low = text.lower()
    if low.startswith("@every"):
        return _every(text)
    text = MACROS.get(low, text)
    fields = text.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6 or uses_hash(text):
        return None
    sec, minute, hour, dom, month, dow = fields
    try:
        when, days = _time(sec, minute, hour), _days(dom, month, dow)
    except (_Unsaid, IndexError, ValueError):
        return None
    return ("daily " if when.startswith("at ") and not days else "") + when + days
