"""The CLI's parsers of user text, one of each kind: durations (`90s`, `1h30m`, `7d`) and
instants (ISO-8601 or `now`). Each raises ValueError with a one-line fix; `*_option` are
the click callbacks that report it against the option."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

import click

_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def parse_duration(text: str) -> float:
    """Seconds from `90`, `1.5`, `90s`, `15m`, `1h30m`, `12h`, `7d`, `2w` or `1d12h` (a part
    without a unit counts seconds: `1h30` is 3630)."""
    t = text.strip().lower()
    try:
        seconds = float(t)
    except ValueError:
        parts = _DURATION_PART.findall(t)
        if parts and "".join(n + u for n, u in parts) == t:
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    else:
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    raise ValueError(f"invalid duration {text!r}: use e.g. 90s, 15m, 1h30m, 12h, 7d or 2w")


def parse_instant(text: str) -> datetime:
    """`now`, ISO-8601 with Z or an offset, or without one (UTC, as cronwell prints)."""
    t = text.strip()
    if t.lower() == "now":
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(
            f"{text!r}: use ISO-8601, e.g. 2026-03-29T00:00:00Z, 2026-03-29T02:30+02:00, "
            "2026-03-29 (UTC midnight) or now"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Click callback: a DURATION option in seconds (unset stays None)."""
    try:
        return None if value is None else parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def instant_option(ctx: click.Context, param: click.Parameter, value: str) -> datetime:
    """Click callback: an INSTANT option as an aware datetime."""
    try:
        return parse_instant(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
