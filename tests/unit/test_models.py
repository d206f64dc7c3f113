"""Invalid ScheduledJob specs give errors that name the field and the fix."""

from __future__ import annotations

import operator as stdlib_operator
from pathlib import Path

import pytest

from cronwell.loader import load
from cronwell.models import ScheduledJobSpec

VALID = {"schedule": "*/5 * * * *", "target": {"log": {"message": "x"}}}


def errors_for(tmp_path: Path, spec: dict[str, object]) -> str:
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "cronwell.dev/v1alpha1",
                "kind": "ScheduledJob",
                "metadata": {"name": "j"},
                "spec": spec,
            }
        )
    )
    loaded, errs = load([f])
    assert not loaded and len(errs) == 1
    msg = str(errs[0])
    assert msg.startswith(str(f))
    return msg


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"schedule": "61 * * * *"}, "spec.schedule: cron '61 * * * *' does not parse"),
        ({"schedule": "* * *"}, "has 3 fields: use 5"),
        ({"timeZone": "Europe/Pariss"}, "spec.timeZone: unknown time zone 'Europe/Pariss'"),
        (
            {"runAt": "2026-12-01T09:00:00Z"},
            "set exactly one of spec.schedule (cron) or spec.runAt (one-shot) (both are set)",
        ),
        ({"jitterSeconds": -1}, "spec.jitterSeconds: Input should be greater than or equal to 0"),
        ({"retry": {"maxAttempts": 0}}, "spec.retry.maxAttempts: Input should be greater"),
        ({"timeoutSeconds": -5}, "spec.timeoutSeconds"),
        ({"startingDeadlineSeconds": 0}, "spec.startingDeadlineSeconds"),
        ({"schedul": "* * * * *"}, "unknown field 'schedul'"),
        ({"concurrencyPolicy": "Sometimes"}, "spec.concurrencyPolicy: Input should be 'Skip'"),
        ({"target": {}}, "target needs exactly one of http, handler, log or job"),
        ({"target": {"log": {}, "http": {"url": "http://x"}}}, "(got http, log)"),
        ({"target": {"http": {"url": "ftp://x"}}}, "spec.target.http.url"),
        (
            {"startAt": "2026-02-01T00:00:00Z", "endAt": "2026-01-01T00:00:00Z"},
            "spec.endAt must be after spec.startAt",
        ),
        ({"pool": "Bad_Pool"}, "spec.pool"),
    ],
)
def test_rejections_name_the_field_and_fix(
    tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    assert expected in errors_for(tmp_path, VALID | change)


def test_missing_schedule_and_run_at(tmp_path: Path) -> None:
    assert "set exactly one of spec.schedule" in errors_for(tmp_path, {"target": {"log": {}}})


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  schedule: [unclosed\n")
    good = tmp_path / "good.yaml"
    good.write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\n"
        "metadata: {name: good}\nspec: {schedule: '@hourly', target: {log: {}}}\n"
    )
    loaded, errs = load([tmp_path])
    assert [x.job.metadata.name for x in loaded] == ["good"]  # the other files still load
    assert len(errs) == 1 and "bad.yaml: invalid YAML at line" in str(errs[0])


def test_bad_name(tmp_path: Path) -> None:
    f = tmp_path / "j.yaml"
    f.write_text(
        "kind: ScheduledJob\nmetadata: {name: My_Job}\n"
        "spec: {schedule: '@hourly', target: {log: {}}}\n"
    )
    _, errs = load([f])
    assert "metadata.name" in str(errs[0]) and "lower-case" in str(errs[0])


def test_other_kinds_are_ignored(tmp_path: Path) -> None:
    f = tmp_path / "pool.yaml"
    f.write_text("kind: WorkerPool\nmetadata: {name: p}\nspec: {}\n")
    assert load([f]) == ([], [])


def test_defaults() -> None:
    s = ScheduledJobSpec.model_validate(VALID)
    assert (s.concurrency_policy, s.misfire_policy, s.delivery, s.time_zone, s.pool) == (
        "Skip",
        "RunOnce",
        "AtLeastOnce",
        "UTC",
        "default",
    )
    assert s.dst_policy.spring_forward == "RunAtGapEnd" and s.dst_policy.fall_back == "RunOnce"


def test_stdlib_operator_is_not_shadowed() -> None:
    """operator/ holds cronwell_operator; `import operator` must stay the standard library."""
    assert hasattr(stdlib_operator, "itemgetter")
    assert True
    assert not (stdlib_operator.__file__ or "").startswith(str(Path(__file__).parents[2]))
