"""A ScheduledJob's status and Events, computed from the store's facts (no I/O): what the
status writer (status.py) patches and posts, and how it tells that nothing changed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cronwell.conditions import condition
from cronwell.models import (
    MAX_ACTIVE_REFS,
    Condition,
    JobReference,
    LastResult,
    RunCounters,
    ScheduledJobStatus,
)
from cronwell.schedule import format_instant

if TYPE_CHECKING:  # the store's row types only: this module does no I/O
    from cronwell.store.status_changes import JobStatus, StatusChange

_RESULTS = {
    "succeeded": LastResult.SUCCEEDED,
    "dead": LastResult.DEAD,
    "missed": LastResult.MISSED,
    "skipped": LastResult.SKIPPED,
    "cancelled": LastResult.CANCELLED,
}


def format_duration(seconds: float | None) -> str | None:
    """Go-style durations, as kubectl shows them: 850ms, 12.5s, 3m4s, 2h0m5s."""
    if seconds is None:
        return None
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{seconds:.1f}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


def _utc(t: datetime | None) -> datetime | None:
    return t.astimezone(UTC).replace(microsecond=0) if t is not None else None


def build_status(
    row: JobStatus | None,
    *,
    previous: Mapping[str, Any] | None,
    spec_error: tuple[int, str] | None,
    now: datetime,
) -> dict[str, Any]:
    """The status to write (camelCase JSON; None removes a field in a merge patch).

    `row` is the store's facts of the job (None: the store has no live job for the CR),
    `previous` the status the CR shows (for condition transition times), `spec_error` the
    generation and message of a spec the store refused.
    """
    prev_conditions = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    gen = row.generation if row is not None else None
    invalid = spec_error is not None and (gen is None or spec_error[0] > gen)

    def cond(type_: str, ok: bool, reason: str, message: str) -> Condition:
        status = "True" if ok else "False"
        return condition(Condition, type_, status, reason, message, gen, prev_conditions, now)

    if row is None:
        status = ScheduledJobStatus(
            conditions=[
                cond(
                    "Ready",
                    False,
                    "InvalidSpec" if invalid else "NotReconciled",
                    spec_error[1] if spec_error and invalid else "not in the store yet",
                )
            ]
        )
        return _dump(status)

    suspended, why = row.suspended, row.suspended_reason
    failures = row.consecutive_failures
    if invalid and spec_error is not None:
        ready = cond("Ready", False, "InvalidSpec", spec_error[1])
    elif suspended and why == "SuspendedAfterFailures":
        ready = cond(
            "Ready",
            False,
            "SuspendedAfterFailures",
            f"suspended after {failures} dead-lettered runs in a row: fix the cause, then "
            "change the spec (e.g. toggle spec.suspend) or run `cronwell resume`",
        )
    elif suspended:
        ready = cond("Ready", True, "Suspended", "suspended: no run is scheduled")
    elif row.schedule_done:
        ready = cond("Ready", True, "Completed", "no further run is scheduled")
    else:
        ready = cond("Ready", True, "Scheduled", "the store runs this generation")

    if suspended:
        # The store's reasons that are also condition reasons; anything else is the spec's.
        reason = why if why in {"SuspendedAfterFailures", "Manual", "Paused"} else "Spec"
        susp = cond("Suspended", True, reason, f"suspended ({reason})")
    else:
        susp = cond("Suspended", False, "Active", "runs are scheduled")

    last_fail, last_ok = row.last_failure_time, row.last_successful_time
    if last_fail is not None and (last_ok is None or last_fail > last_ok):
        failing = cond(
            "Failing",
            True,
            "AttemptFailed",
            f"last attempt failed at {format_instant(last_fail)}: "
            f"{row.last_error or 'unknown error'}",
        )
    else:
        failing = cond("Failing", False, "NoFailures", "no attempt failed since the last success")

    if failures > 0:
        dead_reason = (row.last_reason if row.last_state == "dead" else None) or "DeadLettered"
        dead = cond(
            "DeadLettered",
            True,
            dead_reason,
            f"{failures} run(s) in a row dead-lettered"
            + (f"; latest {row.last_key}" if row.last_state == "dead" else ""),
        )
    else:
        dead = cond("DeadLettered", False, "NoDeadLetters", "the latest run was not dead-lettered")

    # The running Jobs of a job target (names the workers recorded); none for others.
    refs = [JobReference(name=n, namespace=row.namespace) for n in row.active_jobs or []]
    status = ScheduledJobStatus(
        observed_generation=gen,
        next_schedule_time=_utc(row.next_schedule_time),
        last_schedule_time=_utc(row.last_schedule_time),
        last_successful_time=_utc(last_ok),
        last_failure_time=_utc(last_fail),
        last_result=_RESULTS.get(row.last_state or ""),
        last_duration=format_duration(
            float(row.last_duration_seconds) if row.last_duration_seconds is not None else None
        ),
        consecutive_failures=failures,
        active=refs[:MAX_ACTIVE_REFS] or None,
        active_count=row.active or 0,
        counters=RunCounters(
            succeeded=row.succeeded,
            failed=row.failed,
            dead=row.dead,
            missed=row.missed_total,
            skipped=row.skipped,
        ),
        conditions=[ready, susp, failing, dead],
    )
    return _dump(status)


def _dump(status: ScheduledJobStatus) -> dict[str, Any]:
    # kopf's bookkeeping (status.kopf) is never touched; every other field is ours.
    doc: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude={"kopf"})
    return doc


def same_status(ours: Mapping[str, Any], shown: Mapping[str, Any] | None) -> bool:
    """Would patching `ours` change what the CR shows? (None fields mean absent.)"""
    shown = shown or {}
    for key, value in ours.items():
        if value is None:
            if shown.get(key) is not None:
                return False
        elif _norm(shown.get(key)) != _norm(value):
            return False
    return True


def _norm(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


@dataclass(frozen=True)
class EventSpec:
    type: str
    reason: str
    message: str


def events_for(changes: Iterable[StatusChange]) -> list[EventSpec]:
    """Warning Events for one job's changes in a pass: dead letters, missed runs and failed
    attempts, one Event per reason with a count (never one per row)."""
    by_kind: dict[str, list[StatusChange]] = defaultdict(list)
    for ch in changes:
        state = ch.state
        if state == "dead":
            by_kind["DeadLettered"].append(ch)
        elif state == "missed":
            by_kind["MissedRun"].append(ch)
        elif state == "pending" and (ch.attempt or 0) > 0:
            by_kind["AttemptFailed"].append(ch)
    out = []
    for reason, rows in by_kind.items():
        latest = max(rows, key=lambda r: r.id)
        when = format_instant(latest.scheduled_for) if latest.scheduled_for else "?"
        detail = latest.error or latest.reason or ""
        if reason == "DeadLettered":
            msg = f"{len(rows)} run(s) dead-lettered; latest {when}"
        elif reason == "MissedRun":
            msg = f"{len(rows)} run(s) missed; latest {when}"
        else:
            msg = f"{len(rows)} attempt(s) failed and will be retried; latest {when}"
            msg += f" (attempt {latest.attempt})"
        out.append(EventSpec("Warning", reason, f"{msg}: {detail}" if detail else msg))
    return out


def spec_error_reason(message: str) -> str:
    """The Event reason of a refused spec: specific where Kubernetes CronJob has one."""
    if "spec.timeZone" in message:
        return "UnknownTimeZone"
    if "spec.schedule" in message:
        return "InvalidSchedule"
    return "InvalidSpec"


# Ready=False reasons that are failures the user must act on (each posts one Warning).
_FAILING_READY = {"InvalidSpec", "SuspendedAfterFailures"}


def transition_events(
    previous: Mapping[str, Any] | None, status: Mapping[str, Any]
) -> list[EventSpec]:
    """A Warning Event when the Ready condition enters a failure (a refused spec, a
    suspension after failures) or its message changes: once per transition, never per
    pass or per metadata-only edit (the CR's own status is the memory, so a restarted
    operator does not post it again)."""
    prev = _ready(previous)
    new = _ready(status)
    if new.get("status") != "False" or new.get("reason") not in _FAILING_READY:
        return []
    if (prev.get("reason"), prev.get("message")) == (new.get("reason"), new.get("message")):
        return []
    message = str(new.get("message") or "")
    reason = str(new["reason"])
    if reason == "InvalidSpec":
        reason = spec_error_reason(message)
    return [EventSpec("Warning", reason, message)]


def _ready(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return {}
