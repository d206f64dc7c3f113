"""The operator's pure parts: the status a store row becomes, Events, the rate limiter, the
admission checks and the error mapping (no I/O)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import kopf
import pytest

from cronwell.errors import DatabaseError, DatabaseUnavailable, JobNotFound, SpecError
from cronwell.models import ScheduledJobStatus
from cronwell.store.status_changes import JobStatus, StatusChange
from cronwell_operator import kopf_handlers, ratelimit, status_build, webhook
from cronwell_operator.settings import OperatorSettings, WebhookSettings

NOW = datetime(2026, 3, 1, 12, 0, 30, 123456, tzinfo=UTC)


def row(**over: Any) -> JobStatus:
    base: dict[str, Any] = {
        "id": uuid.UUID(int=1),
        "namespace": "default",
        "name": "job",
        "deleted_at": None,
        "last_state_error": None,
        "generation": 3,
        "suspended": False,
        "suspended_reason": None,
        "consecutive_failures": 0,
        "missed_total": 0,
        "next_schedule_time": NOW + timedelta(minutes=1),
        "schedule_done": False,
        "last_schedule_time": None,
        "active": 0,
        "active_jobs": None,
        "succeeded": 0,
        "dead": 0,
        "skipped": 0,
        "last_successful_time": None,
        "failed": 0,
        "last_failure_time": None,
        "last_error": None,
        "last_state": None,
        "last_reason": None,
        "last_key": None,
        "last_duration_seconds": None,
    }
    return JobStatus(**(base | over))


def change(id: int, state: str, **over: Any) -> StatusChange:
    base: dict[str, Any] = {"job_id": uuid.UUID(int=1), "occurrence_id": id, "attempt": None}
    base |= {"scheduled_for": None, "reason": None, "error": None, "changed_at": NOW}
    return StatusChange(id=id, state=state, **(base | over))


def conds(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


def test_a_fresh_job() -> None:
    st = status_build.build_status(row(), previous=None, spec_error=None, now=NOW)
    ScheduledJobStatus.model_validate(st)  # valid against the CRD's own model
    assert st["observedGeneration"] == 3
    assert st["nextScheduleTime"] == "2026-03-01T12:01:30Z"  # seconds, UTC, Z
    assert st["lastResult"] is None and st["lastFailureTime"] is None  # removed by the patch
    assert "kopf" not in st  # kopf's bookkeeping is never touched
    assert conds(st) == {
        "Ready": ("True", "Scheduled"),
        "Suspended": ("False", "Active"),
        "Failing": ("False", "NoFailures"),
        "DeadLettered": ("False", "NoDeadLetters"),
    }


def test_success_then_failures_then_auto_suspension() -> None:
    ok = row(
        succeeded=5,
        last_state="succeeded",
        last_successful_time=NOW - timedelta(minutes=2),
        last_schedule_time=NOW - timedelta(minutes=2),
        last_duration_seconds=Decimal("1.25"),
    )
    st = status_build.build_status(ok, previous=None, spec_error=None, now=NOW)
    assert (st["lastResult"], st["lastDuration"], st["counters"]["succeeded"]) == (
        "Succeeded",
        "1.25s",
        5,
    )
    bad = dataclasses.replace(
        ok,
        failed=4,
        dead=2,
        consecutive_failures=2,
        last_failure_time=NOW - timedelta(seconds=5),
        last_error="connect refused",
        last_state="dead",
        last_reason="AttemptsExhausted",
        last_key="k:1",
        suspended=True,
        suspended_reason="SuspendedAfterFailures",
        next_schedule_time=None,
    )
    later = NOW + timedelta(minutes=1)
    st2 = status_build.build_status(bad, previous=st, spec_error=None, now=later)
    assert conds(st2) == {
        "Ready": ("False", "SuspendedAfterFailures"),
        "Suspended": ("True", "SuspendedAfterFailures"),
        "Failing": ("True", "AttemptFailed"),
        "DeadLettered": ("True", "AttemptsExhausted"),
    }
    assert st2["consecutiveFailures"] == 2 and st2["lastResult"] == "Dead"
    assert (
        "connect refused" in next(c for c in st2["conditions"] if c["type"] == "Failing")["message"]
    )
    # A condition keeps its transition time while its status stays the same.
    st3 = status_build.build_status(
        bad, previous=st2, spec_error=None, now=later + timedelta(hours=1)
    )
    assert st3["conditions"] == st2["conditions"]
    assert status_build.same_status(st3, st2)


def test_spec_errors_and_missing_rows() -> None:
    st = status_build.build_status(
        None, previous=None, spec_error=(1, "spec.timeZone: bad"), now=NOW
    )
    assert conds(st)["Ready"] == ("False", "InvalidSpec")
    assert st["conditions"][0]["message"] == "spec.timeZone: bad"
    # An error about a generation the store has since applied is stale.
    st = status_build.build_status(row(), previous=None, spec_error=(2, "old"), now=NOW)
    assert conds(st)["Ready"] == ("True", "Scheduled")
    st = status_build.build_status(row(), previous=None, spec_error=(4, "new"), now=NOW)
    assert conds(st)["Ready"] == ("False", "InvalidSpec")


def test_same_status_ignores_kopf_and_treats_none_as_absent() -> None:
    ours = status_build.build_status(row(), previous=None, spec_error=None, now=NOW)
    shown = {k: v for k, v in ours.items() if v is not None} | {"kopf": {"progress": {}}}
    assert status_build.same_status(ours, shown)
    assert not status_build.same_status(ours, shown | {"lastResult": "Dead"})
    assert not status_build.same_status(ours, None)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, None), (0.0421, "42ms"), (1.5, "1.5s"), (12.34, "12.3s"), (75, "1m15s"),
     (7322, "2h2m2s")],
)  # fmt: skip
def test_durations_read_like_kubectl(seconds: float | None, text: str | None) -> None:
    assert status_build.format_duration(seconds) == text


def test_events_are_one_per_reason_with_a_count() -> None:
    t = NOW
    changes = [
        change(1, "running", attempt=1, scheduled_for=t),
        change(2, "pending", attempt=1, scheduled_for=t, error="boom"),
        change(3, "dead", attempt=2, scheduled_for=t, reason="Exhausted"),
        change(4, "missed", scheduled_for=t, reason="Misfire"),
        change(5, "missed", scheduled_for=t + timedelta(minutes=1), reason="M2"),
        change(6, "succeeded", attempt=1, scheduled_for=t),
    ]
    evs = {e.reason: e for e in status_build.events_for(changes)}
    assert set(evs) == {"AttemptFailed", "DeadLettered", "MissedRun"}
    assert all(e.type == "Warning" for e in evs.values())
    assert evs["MissedRun"].message == "2 run(s) missed; latest 2026-03-01T12:01:30Z: M2"
    assert evs["AttemptFailed"].message.endswith("(attempt 1): boom")
    assert status_build.events_for([changes[0], changes[5]]) == []


async def test_token_bucket_holds_the_rate() -> None:
    bucket = ratelimit.TokenBucket(rate=50, burst=5)
    started = time.monotonic()
    await asyncio.gather(*(bucket.take() for _ in range(25)))
    # 5 at once, then 20 at 50/s: at least 0.4 s.
    assert time.monotonic() - started >= 0.38


SETTINGS = OperatorSettings(identity="t", webhook=WebhookSettings(payload_max_bytes=100))


def doc(spec: dict[str, Any], name: str = "j") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def test_webhook_accepts_a_good_spec_and_metadata_only_changes() -> None:
    good = doc({"schedule": "*/5 * * * *", "target": {"log": {}}})
    assert webhook.problems(good, None, settings=SETTINGS) is None
    bad = doc({"schedule": "nope", "target": {"log": {}}})
    assert webhook.problems(bad, None, settings=SETTINGS)
    # An object stored before the webhook existed can still be annotated and deleted.
    assert (
        webhook.problems(bad | {"metadata": {"name": "j", "x": 1}}, bad, settings=SETTINGS) is None
    )
    deleting = bad | {"metadata": {"name": "j", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert webhook.problems(deleting, None, settings=SETTINGS) is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"schedule": "61 * * * *", "target": {"log": {}}},
         "ScheduledJob j: spec.schedule: cron '61 * * * *' does not parse"),
        ({"schedule": "@daily", "timeZone": "Nowhere/Town", "target": {"log": {}}},
         "spec.timeZone: unknown time zone 'Nowhere/Town': use an IANA name"),
        ({"schedule": "@daily", "target": {"handler": {"name": "h", "payload": {"x": "y" * 200}}}},
         "spec.target.handler.payload: 208 bytes is over the 100-byte limit"),
    ],
)  # fmt: skip
def test_webhook_names_the_field_and_the_fix(spec: dict[str, Any], expected: str) -> None:
    problem = webhook.problems(doc(spec), None, settings=SETTINGS)
    assert problem is not None and expected in problem


def test_cronwell_errors_map_to_kopf_errors_explicitly() -> None:
    assert kopf_handlers.kopf_error(DatabaseUnavailable("down")).delay == 10  # type: ignore[union-attr]
    assert kopf_handlers.kopf_error(DatabaseError("x")).delay == 30  # type: ignore[union-attr]
    assert isinstance(kopf_handlers.kopf_error(JobNotFound("x")), kopf.TemporaryError)
    assert isinstance(kopf_handlers.kopf_error(SpecError("x")), kopf.PermanentError)


def test_a_failing_ready_posts_one_warning_per_transition() -> None:
    bad = status_build.build_status(
        None, previous=None, spec_error=(1, "spec.timeZone: unknown time zone 'x'"), now=NOW
    )
    (ev,) = status_build.transition_events(None, bad)
    assert (ev.type, ev.reason) == ("Warning", "UnknownTimeZone")
    assert "unknown time zone" in ev.message
    # the same failure again (a metadata-only edit, a restart): nothing new to say
    assert status_build.transition_events(bad, bad) == []
    # another failure is another transition
    cron = status_build.build_status(
        None, previous=bad, spec_error=(2, "spec.schedule: x"), now=NOW
    )
    assert [e.reason for e in status_build.transition_events(bad, cron)] == ["InvalidSchedule"]
    # recovering posts no Warning
    ok = status_build.build_status(row(), previous=cron, spec_error=None, now=NOW)
    assert status_build.transition_events(cron, ok) == []


def test_active_lists_the_running_jobs_as_a_cronjob_does() -> None:
    """status.active: object references of the running Jobs (newest first, as the store
    returns them, at most 10); the count of every active occurrence is activeCount."""
    names = [f"report-{i}" for i in range(12)]
    st = status_build.build_status(
        row(active=14, active_jobs=names, namespace="billing"),
        previous=None,
        spec_error=None,
        now=NOW,
    )
    ScheduledJobStatus.model_validate(st)
    assert st["activeCount"] == 14
    assert st["active"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": n, "namespace": "billing"}
        for n in names[:10]
    ]
    # Nothing runs as a Job (another target, or between claim and create): the field is
    # removed (None in a merge patch), the count stays.
    for none in (None, []):
        st = status_build.build_status(
            row(active=2, active_jobs=none), previous=None, spec_error=None, now=NOW
        )
        assert st["active"] is None and st["activeCount"] == 2
    assert status_build.same_status(st, {**st, "active": None})
