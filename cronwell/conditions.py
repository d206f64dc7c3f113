"""Kubernetes-style status conditions for our CRs (ScheduledJob and WorkerPool alike)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from cronwell.models import Condition

C = TypeVar("C", bound=Condition)


def condition(
    model: type[C],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
    now: datetime,
) -> C:
    """A `model` condition that keeps its lastTransitionTime while its status does not
    change (`previous`: the conditions the CR shows, by type); times to the second, UTC,
    so an unchanged condition compares equal to what the CR shows."""
    prev = previous.get(type_)
    since = now.astimezone(UTC).replace(microsecond=0)
    if prev is not None and prev.get("status") == status and prev.get("lastTransitionTime"):
        since = datetime.fromisoformat(str(prev["lastTransitionTime"]).replace("Z", "+00:00"))
    return model(
        type=type_,
        status=status,
        reason=reason,
        message=message[:2000],
        last_transition_time=since,
        observed_generation=generation,
    )
