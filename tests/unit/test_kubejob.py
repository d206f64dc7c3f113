"""Job names, labels and the adopt-or-create decision (cronwell.kubejob): pure functions."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronwell import kubejob
from cronwell.kubejob import Adopt, Create, Occurrence
from cronwell.models import JobTemplate

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
UID = "0b8f6c1e-3f0c-4b8e-9a53-0d6a1a1f2c3d"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def key(at: datetime = T0, uid: str = UID) -> str:
    return f"{uid}:{at.isoformat()}"


def occ(name: str = "nightly-report", **kw: Any) -> Occurrence:
    base: dict[str, Any] = {
        "namespace": "billing",
        "scheduledjob": name,
        "scheduledjob_uid": UID,
        "pool": "default",
        "key": key(),
        "scheduled_for": T0,
        "attempt": 3,
        "fence": 17,
    }
    return Occurrence(**(base | kw))


def assert_valid(name: str) -> None:
    assert len(name) <= 63, name
    assert DNS_LABEL.match(name), name


def test_name_reads_as_the_scheduledjob_then_a_hash() -> None:
    name = kubejob.job_name("nightly-report", key())
    assert re.fullmatch(r"nightly-report-[a-z2-7]{10}", name)
    assert kubejob.job_name("nightly-report", key()) == name  # deterministic
    assert kubejob.job_name("nightly-report", key(), 1) == name
    assert kubejob.job_name("nightly-report", key(), 2) == f"{name}-2"
    assert kubejob.job_name("nightly-report", key(), 100) == f"{name}-100"


def test_names_differ_by_instant_and_by_scheduledjob_uid() -> None:
    a = kubejob.job_name("r", key())
    assert kubejob.job_name("r", key(T0 + timedelta(minutes=1))) != a
    # A deleted and re-created ScheduledJob of the same name: a new uid, new Job names.
    assert kubejob.job_name("r", key(uid="ffffffff-3f0c-4b8e-9a53-0d6a1a1f2c3d")) != a


def test_long_names_are_cut_to_63_keeping_the_whole_hash_and_attempt() -> None:
    long = "a" * 50 + "-" + "b" * 12  # 63: the longest ScheduledJob name
    h = kubejob.key_hash(key())
    for attempt in (1, 2, 99, 12345):
        name = kubejob.job_name(long, key(), attempt)
        assert_valid(name)
        assert h in name
        assert name.startswith("a" * 40)
        assert name.endswith(h if attempt == 1 else f"{h}-{attempt}")


def test_a_cut_never_leaves_a_dash_before_the_hash_separator() -> None:
    # Cut exactly after a '-': "x...x-" + "-hash" would read "x--hash"; the dash is dropped.
    name = kubejob.job_name("a" * 51 + "-bbbb", key())
    assert "--" not in name
    assert_valid(name)


@pytest.mark.parametrize(
    ("odd", "prefix"),
    [
        ("Nightly_Report.v2", "nightly-report-v2-"),
        ("--x--", "x-"),
        ("___", "job-"),
        ("", "job-"),
        ("ünïcode", "n-code-"),
    ],
)
def test_odd_names_still_give_dns_labels(odd: str, prefix: str) -> None:
    name = kubejob.job_name(odd, key())
    assert_valid(name)
    assert name.startswith(prefix)


@given(st.text(max_size=80), st.text(min_size=1, max_size=120), st.integers(1, 10**6))
def test_every_name_is_a_dns_label(scheduledjob: str, k: str, attempt: int) -> None:
    assert_valid(kubejob.job_name(scheduledjob, k, attempt))


def test_no_collision_among_a_months_minutely_keys() -> None:
    hashes = {kubejob.key_hash(key(T0 + timedelta(minutes=m))) for m in range(43_200)}
    assert len(hashes) == 43_200


def test_attempt_starts_at_one() -> None:
    with pytest.raises(ValueError, match="starts at 1"):
        kubejob.job_name("j", key(), 0)


TEMPLATE = JobTemplate.model_validate(
    {
        "metadata": {"labels": {"team": "billing"}, "annotations": {"note": "kept"}},
        "spec": {
            "backoffLimit": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "env": [
                                {"name": "MINE", "value": "1"},
                                {"name": "CRONWELL_FENCE_TOKEN", "value": "forged"},
                            ],
                        }
                    ],
                }
            },
        },
    }
)


def test_manifest_carries_identity_owner_and_environment() -> None:
    o = occ()
    job = kubejob.manifest(TEMPLATE, o, 2)
    meta = job["metadata"]
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert meta["name"] == kubejob.job_name("nightly-report", o.key, 2)
    assert meta["namespace"] == "billing"
    assert meta["labels"] == {
        "team": "billing",
        "cronwell.dev/scheduledjob": "nightly-report",
        "cronwell.dev/pool": "default",
        "cronwell.dev/key-hash": kubejob.key_hash(o.key),
        "cronwell.dev/scheduled-for": "20261201T090000Z",
        "cronwell.dev/job-attempt": "2",
    }
    assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in meta["labels"].values())
    assert meta["annotations"] == {
        "note": "kept",
        "cronwell.dev/key": o.key,
        "cronwell.dev/scheduled-for": "2026-12-01T09:00:00+00:00",
        "cronwell.dev/fence": "17",
        "cronwell.dev/attempt": "3",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "cronwell.dev/v1alpha1",
            "kind": "ScheduledJob",
            "name": "nightly-report",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    pod = job["spec"]["template"]["spec"]
    expected_env = [
        {"name": "CRONWELL_IDEMPOTENCY_KEY", "value": o.key},
        {"name": "CRONWELL_FENCE_TOKEN", "value": "17"},
        {"name": "CRONWELL_SCHEDULED_FOR", "value": "2026-12-01T09:00:00+00:00"},
    ]
    assert pod["containers"][0]["env"] == [{"name": "MINE", "value": "1"}, *expected_env]
    assert pod["initContainers"][0]["env"] == expected_env
    assert job["spec"]["backoffLimit"] == 1
    # The template itself is untouched (it is reused for every occurrence).
    assert "env" not in TEMPLATE.spec["template"]["spec"]["initContainers"][0]
    assert len(TEMPLATE.spec["template"]["spec"]["containers"][0]["env"]) == 2


def test_selectors_match_the_labels() -> None:
    o = occ()
    labels = kubejob.job_labels(o, 1)
    for selector in (o.selector(), kubejob.pool_selector("default")):
        for term in selector.split(","):
            k, v = term.split("=")
            assert labels[k] == v


def job(o: Occurrence, attempt: int, condition: str | None = None, **meta: Any) -> dict[str, Any]:
    m = kubejob.manifest(TEMPLATE, o, attempt)
    m["metadata"].update(meta)
    if condition:
        m["status"] = {
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True"},
                {
                    "type": condition,
                    "status": "True",
                    "reason": "BackoffLimitExceeded" if condition == "Failed" else "",
                    "message": "Job has reached the specified backoff limit"
                    if condition == "Failed"
                    else "",
                },
            ]
        }
    return m


def test_state_reads_the_conditions() -> None:
    o = occ()
    assert kubejob.state(job(o, 1)) == ("Active", "")
    assert kubejob.state(job(o, 1, "Complete")) == ("Complete", "")
    assert kubejob.state(job(o, 1, "Failed")) == (
        "Failed",
        "BackoffLimitExceeded: Job has reached the specified backoff limit",
    )
    suspended = job(o, 1)
    suspended["status"] = {"conditions": [{"type": "Failed", "status": "False"}]}
    assert kubejob.state(suspended) == ("Active", "")
    deadline = job(o, 1)
    deadline["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "X"}]}
    assert kubejob.state(deadline) == ("Failed", "X")


def test_next_step_creates_the_first_then_adopts_it() -> None:
    o = occ()
    assert kubejob.next_step([], o) == Create(1)
    first = job(o, 1)
    name = first["metadata"]["name"]
    assert kubejob.next_step([first], o) == Adopt(name)
    # A successor holding a newer claim (attempt 4, fence 18) adopts the same Job.
    assert kubejob.next_step([first], occ(attempt=4, fence=18)) == Adopt(name)
    assert kubejob.next_step([job(o, 1, "Complete")], o) == Adopt(name)


def test_next_step_after_failed_jobs_creates_one_past_the_highest() -> None:
    o = occ()
    assert kubejob.next_step([job(o, 1, "Failed")], o) == Create(2)
    # A Job deleted by hand does not make a number reused.
    assert kubejob.next_step([job(o, 3, "Failed"), job(o, 1, "Failed")], o) == Create(4)
    running = job(o, 2)
    assert kubejob.next_step([job(o, 1, "Failed"), running], o) == Adopt(
        running["metadata"]["name"]
    )


def test_next_step_never_makes_more_jobs_than_max_attempts() -> None:
    """A claim that took over an expired lease past max_attempts (LeaseReap leaves a job
    target pending) adopts the last failed Job, so its failure is recorded and the
    container does not run again."""
    one = occ(attempt=2, max_attempts=1)
    assert kubejob.next_step([], one) == Create(1)  # the lost claim created none
    failed = job(one, 1, "Failed")
    assert kubejob.next_step([failed], one) == Adopt(failed["metadata"]["name"])
    three = occ(attempt=3, max_attempts=3)
    assert kubejob.next_step([job(three, 1, "Failed")], three) == Create(2)
    last = job(three, 3, "Failed")
    jobs = [job(three, 1, "Failed"), last, job(three, 2, "Failed")]
    assert kubejob.next_step(jobs, three) == Adopt(last["metadata"]["name"])
    # A DLQ retry raises max_attempts: new Jobs again.
    assert kubejob.next_step(jobs, occ(attempt=4, max_attempts=6)) == Create(4)


def test_a_job_of_another_key_is_never_adopted() -> None:
    o = occ()
    other = job(occ(key=key(T0 + timedelta(days=1))), 1)
    with pytest.raises(kubejob.JobNameTaken, match="delete or relabel it"):
        kubejob.next_step([other], o)
    assert not kubejob.owned_by(other["metadata"], o)
    assert kubejob.owned_by(job(o, 1)["metadata"], o)


def test_odd_env_is_left_for_the_api_server_to_refuse() -> None:
    template = JobTemplate.model_validate(
        {
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "initContainers": "not a list",
                        "containers": [
                            {"name": "a", "image": "i", "env": "not a list"},
                            {"name": "b", "image": "i", "env": ["not a mapping"]},
                        ],
                    }
                }
            }
        }
    )
    pod = kubejob.manifest(template, occ(), 1)["spec"]["template"]["spec"]
    assert pod["initContainers"] == "not a list"
    assert pod["containers"][0]["env"] == "not a list"
    assert pod["containers"][1]["env"][0] == "not a mapping"
    assert [e["name"] for e in pod["containers"][1]["env"][1:]] == [
        "CRONWELL_IDEMPOTENCY_KEY",
        "CRONWELL_FENCE_TOKEN",
        "CRONWELL_SCHEDULED_FOR",
    ]


def test_a_job_being_deleted_is_never_adopted() -> None:
    """A Job deleted in the foreground (timed out, replaced) stays listed until its Pods are
    gone and will not complete: the next attempt creates the next Job instead."""
    o = occ()
    going = job(o, 1, deletionTimestamp="2026-12-01T09:05:00Z")
    assert kubejob.deleting(going) and not kubejob.adoptable(going)
    assert kubejob.next_step([going], o) == Create(2)
    assert kubejob.adoptable(job(o, 1)) and kubejob.adoptable(job(o, 1, "Complete"))


def history(*spec: tuple[int, str | None], **meta: Any) -> list[dict[str, Any]]:
    """One Job per (minute, condition), each its own occurrence of the same ScheduledJob."""
    out = []
    for m, condition in spec:
        at = T0 + timedelta(minutes=m)
        out.append(job(occ(key=key(at), scheduled_for=at), 1, condition, **meta))
    return out


def minute(name: str, jobs: list[dict[str, Any]]) -> int:
    j = next(j for j in jobs if j["metadata"]["name"] == name)
    at = datetime.fromisoformat(j["metadata"]["annotations"][kubejob.ANNOTATION_SCHEDULED_FOR])
    return int((at - T0).total_seconds() // 60)


def plan(jobs: list[dict[str, Any]], states: dict[str, str | None], ok: int, bad: int) -> Any:
    out = kubejob.to_delete(jobs, states, owner_uid=UID, successful_limit=ok, failed_limit=bad)
    return sorted((minute(n, jobs), p) for n, p in out)


def test_history_limits_delete_the_oldest_finished_jobs_of_recorded_occurrences() -> None:
    jobs = history((0, "Complete"), (1, "Failed"), (2, "Complete"), (3, "Complete"), (4, None))
    recorded = {k: "succeeded" for k in kubejob.keys_of(jobs)}
    assert plan(jobs, recorded, ok=1, bad=1) == [(0, "Background"), (2, "Background")]
    assert plan(jobs, recorded, ok=0, bad=0) == [(m, "Background") for m in (0, 1, 2, 3)]
    assert plan(jobs, recorded, ok=3, bad=1) == []
    # A Job whose occurrence's outcome is not recorded yet is never deleted (a successor
    # would adopt it; decision 4), but it still counts: the limit keeps the newest Jobs.
    for state in ("running", "pending", "waiting", "a-state-added-later"):
        unrecorded = recorded | {kubejob.keys_of(jobs[:1])[0]: state}
        assert plan(jobs, unrecorded, ok=1, bad=1) == [(2, "Background")]
    # An occurrence whose row is gone (history pruned) has its outcome recorded.
    assert plan(jobs, {}, ok=1, bad=1) == [(0, "Background"), (2, "Background")]


def test_replace_deletes_the_running_jobs_of_cancelled_occurrences_in_the_foreground() -> None:
    jobs = history((0, None), (1, None), (2, None))
    k0, k1, k2 = (j["metadata"]["annotations"][kubejob.ANNOTATION_KEY] for j in jobs)
    states: dict[str, str | None] = {k0: "cancelled", k1: "dead", k2: "running"}
    # Only the cancelled occurrence's Job: a dead one's running Job is not Replace's, and
    # the running occurrence's (say a newer one that replaced ours meanwhile) is its own.
    assert plan(jobs, states, ok=100, bad=100) == [(0, "Foreground")]


def test_jobs_of_another_owner_or_being_deleted_are_left_alone() -> None:
    other_owner = history((0, None), (1, "Complete"))
    for j in other_owner:
        j["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    going = history((2, None), (3, "Complete"), deletionTimestamp="2026-12-01T09:05:00Z")
    jobs = other_owner + going
    states: dict[str, str | None] = {k: "cancelled" for k in kubejob.keys_of(jobs)}
    assert plan(jobs, states, ok=0, bad=0) == []
