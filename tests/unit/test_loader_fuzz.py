"""No traceback on any input: the YAML loader, the spec model and `cronwell apply` answer
every file (arbitrary bytes, deep nesting, huge documents, wrong kinds and versions) with
one-line errors naming the file, and apply nothing when any document is bad."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwell.cli import main
from cronwell.loader import load

# A database URL nothing listens on: a command that got past validation would say
# "cannot connect"; the tests below check that invalid input never gets that far.
NO_DB = "postgresql://nobody@127.0.0.1:1/nothing"
GOOD = (
    "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: good}\n"
    "spec: {schedule: '@hourly', target: {log: {}}}\n"
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example (a directory per example left hundreds in /tmp)."""
    return tmp_path_factory.mktemp("fuzz")


def _load_bytes(d: Path, data: bytes) -> tuple[Path, list[Any], list[str]]:
    f = d / "in.yaml"
    f.write_bytes(data)
    loaded, errors = load([f])
    return f, loaded, [str(e) for e in errors]


def _one_line_errors_naming(f: Path, errors: list[str]) -> None:
    for e in errors:
        assert "\n" not in e and "\r" not in e, e
        assert e.startswith(str(f)), e
        assert "Traceback" not in e


def _apply(f: Path) -> Any:
    result = CliRunner().invoke(main, ["--database-url", NO_DB, "apply", "-f", str(f)])
    # Only click's own exits: a ClickException (1) or usage error (2), never another one.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception,
        result.output,
    )
    return result


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(fuzz_dir: Path, data: bytes) -> None:
    f, _, errors = _load_bytes(fuzz_dir, data)
    _one_line_errors_naming(f, errors)


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("{}[]:,-?&*!|>'\"#%@` \n\tab1.")), max_size=400))
def test_yaml_punctuation(fuzz_dir: Path, text: str) -> None:
    f, _, errors = _load_bytes(fuzz_dir, text.encode())
    _one_line_errors_naming(f, errors)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=30,
)
kinds = st.sampled_from(["ScheduledJob", "CronJob", "WorkerPool", "Job", "Secret", None, 3, ["x"]])
versions = st.sampled_from(
    ["cronwell.dev/v1alpha1", "cronwell.dev/v1", "batch/v1", "v1", None, {"a": 1}]
)
specs = st.fixed_dictionaries(
    {},
    optional={
        "schedule": st.sampled_from(["@hourly", "* * *", "61 * * * *", "", 5])
        | st.text(max_size=12),
        "runAt": st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01T00:00:00", "soon"]),
        "timeZone": st.sampled_from(["UTC", "Mars/Base", ""]),
        "target": st.sampled_from(
            [{"log": {}}, {"http": {"url": "http://169.254.169.254/"}}, {}, {"http": {}},
             {"handler": {"name": "h", "payload": {"a": [1, {"b": None}]}}}, "log"]
        ) | json_values,
        "pool": st.sampled_from(["default", "Bad_Pool", ""]),
        "retry": json_values,
        "headers": json_values,
    },
)  # fmt: skip
documents = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": versions,
        "kind": kinds,
        "metadata": st.sampled_from([{"name": "a"}, {"name": "Bad_Name"}, {}, "x", None])
        | json_values,
        "spec": specs | json_values,
    },
)


@FUZZ
@given(st.lists(documents | json_values, min_size=1, max_size=4))
def test_wrong_documents_kinds_and_versions(fuzz_dir: Path, docs: list[Any]) -> None:
    f, _, errors = _load_bytes(fuzz_dir, yaml.safe_dump_all(docs).encode())
    _one_line_errors_naming(f, errors)
    if errors:  # all or nothing: the CLI applies none of the valid ones
        result = _apply(f)
        assert result.exit_code == 1
        assert "nothing applied" in result.output and "cannot connect" not in result.output


def test_deep_nesting_is_one_error(tmp_path: Path) -> None:
    for text in (
        "[" * 100_000 + "]" * 100_000,
        "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 3000)),
    ):
        f = tmp_path / "deep.yaml"
        f.write_text(text)
        loaded, errors = load([f])
        assert not loaded and len(errors) == 1, errors
        _one_line_errors_naming(f, [str(e) for e in errors])


def test_alias_bomb_and_huge_files_are_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\nkind: ScheduledJob\n")
    _, errors = load([f])
    assert len(errors) == 1 and "expands to over 1,000,000 values" in str(errors[0])
    big = tmp_path / "big.yaml"
    with big.open("wb") as out:
        out.truncate(17 * 1024 * 1024)
    _, errors = load([big])
    assert len(errors) == 1 and "over the 16,777,216-byte limit: split it" in str(errors[0])


def test_a_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_bytes(b"kind: ScheduledJob\n\xff\xfe\x00binary")
    result = _apply(f)
    assert result.exit_code == 1
    assert f"error: {f}: not UTF-8 text (byte 0xff at offset 19): save it as UTF-8 YAML" in (
        result.output
    )
    assert "UnicodeDecodeError" not in result.output


def test_a_cronjob_says_how_to_convert_it(tmp_path: Path) -> None:
    f = tmp_path / "cron.yaml"
    f.write_text(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly}\n"
        "spec: {schedule: '0 3 * * *', jobTemplate: {}}\n---\n" + GOOD
    )
    result = _apply(f)
    assert result.exit_code == 1
    assert (
        f"error: {f}#1: kind CronJob is not a ScheduledJob: convert it with `cronwell convert "
        "-f FILE`" in result.output
    )
    assert "docs/migrating-from-cronjob.md" in result.output
    assert "1 invalid document(s); nothing applied" in result.output
    assert "cannot connect" not in result.output  # the good document was not applied either


def test_a_wrong_version_and_a_foreign_cronwell_kind(tmp_path: Path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text(GOOD.replace("v1alpha1", "v2") + "---\napiVersion: cronwell.dev/v1alpha1\n"
                 "kind: Schedule\nmetadata: {name: x}\n")  # fmt: skip
    _, errors = load([f])
    assert [str(e) for e in errors] == [
        f"{f}#1: apiVersion 'cronwell.dev/v2' of kind ScheduledJob is not served: use "
        "apiVersion: cronwell.dev/v1alpha1",
        f"{f}#2: kind 'Schedule' is not a cronwell.dev kind: use kind: ScheduledJob (or "
        "WorkerPool, applied with kubectl)",
    ]


def test_metadata_ssrf_is_refused_by_apply(tmp_path: Path) -> None:
    """The issue's first example: accepted by `cronwell apply` before the egress policy."""
    f = tmp_path / "ssrf.yaml"
    f.write_text(
        GOOD.replace("{log: {}}", "{http: {url: 'http://169.254.169.254/latest/meta-data'}}")
    )
    result = _apply(f)
    assert result.exit_code == 1
    assert (
        "spec.target.http.url: host '169.254.169.254' is link-local (cloud metadata) "
        "(169.254.0.0/16)" in result.output
    )
    assert "nothing applied" in result.output and "cannot connect" not in result.output


@FUZZ
@given(specs | json_values)
def test_the_spec_model_and_the_webhook_answer_any_spec(spec: Any) -> None:
    """The model raises only its validation error, which formats to one line; the
    webhook's spec rules (the same model, plus the payload size) never raise."""
    import pydantic

    from cronwell.loader import format_validation_error
    from cronwell.models import ScheduledJobSpec
    from cronwell_operator.settings import OperatorSettings
    from cronwell_operator.webhook import problems

    try:
        ScheduledJobSpec.model_validate(spec)
    except pydantic.ValidationError as e:
        assert format_validation_error(e)
    body = {"apiVersion": "cronwell.dev/v1alpha1", "kind": "ScheduledJob",
            "metadata": {"name": "fuzz", "namespace": "default"}, "spec": spec}  # fmt: skip
    denial = problems(body, None, settings=OperatorSettings())
    assert denial is None or (denial.startswith("ScheduledJob fuzz: ") and "\n" not in denial)
