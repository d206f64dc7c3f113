"""Cron expressions and time zones: parsing and validation, cached (every spec validation
and every claimed occurrence asks again about the same few expressions)."""

from __future__ import annotations

import functools
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from cronwell.errors import SpecError

_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}


@functools.lru_cache(maxsize=1024)
def load_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise SpecError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Paris' or 'UTC'",
            field="spec.timeZone",
        ) from e


_HASHED = re.compile(r"(?<![A-Za-z])H(?![A-Za-z])")


def uses_hash(expr: str) -> bool:
    """True if the cron has an `H` field, so its instants depend on the job uid."""
    return bool(_HASHED.search(expr))


def croniter_args(expr: str) -> dict[str, object]:
    fields = expr.split()
    # Six fields: seconds come first (Quartz/Spring order), croniter wants that said.
    return {"second_at_beginning": len(fields) == 6}


@functools.lru_cache(maxsize=4096)
def validate_cron(expr: str) -> None:
    """Raise SpecError with the fix unless `expr` is a cron cronwell accepts."""
    stripped = expr.strip()
    if stripped.lower() in _MACROS:
        return
    if stripped.startswith("@"):
        raise SpecError(
            f"unknown cron macro {stripped!r}: use one of {', '.join(sorted(_MACROS))}",
            field="spec.schedule",
        )
    n = len(stripped.split())
    if n not in (5, 6):
        raise SpecError(
            f"cron {stripped!r} has {n} fields: use 5 (minute hour day month weekday) "
            "or 6 with seconds first",
            field="spec.schedule",
        )
    try:
        croniter(stripped, datetime(2000, 1, 1), hash_id=b"validate", **croniter_args(stripped))
    except (CroniterError, ValueError, KeyError) as e:
        raise SpecError(f"cron {stripped!r} does not parse: {e}", field="spec.schedule") from e
