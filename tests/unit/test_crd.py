"""The CRD YAML in crds/ is generated from the pydantic models and agrees with them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from cronwell import crdgen
from cronwell.loader import load
from cronwell.models import ScheduledJobSpec

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"


def _schema() -> dict[str, Any]:
    crd = crdgen.scheduledjob_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


FILES = ["cronwell.dev_scheduledjobs.yaml", "cronwell.dev_workerpools.yaml"]


@pytest.mark.parametrize("directory", [CRDS, ROOT / "charts" / "cronwell" / "crds-src"])
def test_checked_in_crds_are_up_to_date(directory: Path) -> None:
    expected = crdgen.manifests()
    assert sorted(expected) == FILES
    assert sorted(p.name for p in directory.glob("*.yaml")) == FILES
    for name, text in expected.items():
        assert (directory / name).read_text() == text, (
            f"{directory.relative_to(ROOT)}/{name} is stale: run `make manifests`"
        )


@pytest.mark.parametrize("name", FILES)
def test_check_mode_reports_a_stale_file(tmp_path: Path, name: str) -> None:
    assert crdgen.main([str(tmp_path)]) == 0
    assert crdgen.main([str(tmp_path), "--check"]) == 0
    (tmp_path / name).write_text("stale")
    assert crdgen.main([str(tmp_path), "--check"]) == 1


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.items():
            if key == "properties":
                for name, prop in value.items():
                    out += _walk(prop, f"{path}.{name}")
            elif key == "items":
                out += _walk(value, f"{path}[]")
    return out


@pytest.mark.parametrize("source", crdgen.SOURCES, ids=lambda s: s.kind)
def test_schema_is_structural(source: crdgen.CrdSource) -> None:
    """What the API server rejects or silently mishandles is absent."""
    schema = crdgen.crd(source)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    for forbidden in ("$ref", "$defs", "anyOf", "title:", "additionalProperties: false", "const:"):
        assert forbidden not in text
    for path, node in _walk(schema):
        assert "type" in node, f"{path or '(root)'} has no type"
        if node["type"] == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "properties" in node or "additionalProperties" in node or path == ".metadata"


def test_names_scope_and_status_subresource() -> None:
    crd = crdgen.scheduledjob_crd()
    assert crd["metadata"]["name"] == "scheduledjobs.cronwell.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["shortNames"], names["categories"]) == (
        "ScheduledJob",
        ["sj"],
        ["cronwell"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    cols = crdgen.scheduledjob_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"].upper() for c in cols if not c.get("priority")]
    wide = [c["name"].upper() for c in cols if c.get("priority") == 1]
    assert default == [
        "SCHEDULE",
        "TIMEZONE",
        "SUSPEND",
        "ACTIVE",
        "LAST SCHEDULE",
        "LAST RESULT",
        "NEXT RUN",
        "AGE",
    ]
    assert wide == ["POOL", "SUCCEEDED", "FAILED", "MISSED", "SKIPPED"]
    status = _schema()["properties"]["status"]
    for col in cols:
        parts = col["jsonPath"].lstrip(".").split(".")
        node = _schema()
        for part in parts:
            node = node["properties"][part] if part != "creationTimestamp" else {"type": "x"}
        assert node, col
    assert status["properties"]["conditions"]["x-kubernetes-list-type"] == "map"


def _apply_defaults(schema: dict[str, Any], doc: Any) -> Any:
    """The API server's structural defaulting, enough for this schema."""
    if not isinstance(doc, dict) or schema.get("type") != "object":
        return doc
    for name, prop in (schema.get("properties") or {}).items():
        if name not in doc and "default" in prop:
            doc[name] = copy.deepcopy(prop["default"])
        if name in doc:
            doc[name] = _apply_defaults(prop, doc[name])
    return doc


@pytest.mark.parametrize(
    "spec",
    [
        {"schedule": "* * * * *", "target": {"log": {}}},
        {"runAt": "2030-01-01T00:00:00Z", "target": {"http": {"url": "https://x.example"}}},
        {"schedule": "@daily", "retry": {"maxAttempts": 7}, "target": {"handler": {"name": "h"}}},
    ],
)
def test_crd_defaults_equal_pydantic_defaults(spec: dict[str, Any]) -> None:
    """A spec defaulted by the API server means exactly what pydantic makes of the original,
    so the store sees the same spec (and spec hash) either way."""
    defaulted = _apply_defaults(_schema()["properties"]["spec"], copy.deepcopy(spec))
    assert defaulted != spec  # something was filled in
    assert ScheduledJobSpec.model_validate(defaulted) == ScheduledJobSpec.model_validate(spec)


def _messages(spec: dict[str, Any]) -> str:
    with pytest.raises(pydantic.ValidationError) as exc:
        ScheduledJobSpec.model_validate(spec)
    return str(exc.value)


def test_cel_rules_say_what_the_models_say() -> None:
    spec_rules = {
        r["rule"]: r["message"] for r in _schema()["properties"]["spec"]["x-kubernetes-validations"]
    }
    target = _schema()["properties"]["spec"]["properties"]["target"]
    (target_rule,) = target["x-kubernetes-validations"]
    both = {"schedule": "* * * * *", "runAt": "2030-01-01T00:00:00Z", "target": {"log": {}}}
    assert spec_rules["has(self.schedule) != has(self.runAt)"] in _messages(both)
    backwards = {
        "schedule": "* * * * *",
        "startAt": "2030-01-02T00:00:00Z",
        "endAt": "2030-01-01T00:00:00Z",
        "target": {"log": {}},
    }
    assert "spec.endAt must be after spec.startAt" in _messages(backwards)
    assert "spec.endAt must be after spec.startAt" in spec_rules.values()
    two = {"schedule": "* * * * *", "target": {"log": {}, "handler": {"name": "x"}}}
    assert target_rule["message"] in _messages(two)


def test_examples_are_valid_scheduledjobs() -> None:
    loaded, errors = load([ROOT / "examples" / "scheduledjobs"])
    assert errors == []
    assert len(loaded) >= 5
