"""The WorkerPool CRD generated from cronwell/workerpool.py: names, printer columns, defaults
and CEL rules that say what the model says, and the examples it ships."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from cronwell import crdgen
from cronwell.workerpool import WorkerPool, WorkerPoolSpec, WorkerPoolStatus
from tests.unit.test_crd import _apply_defaults

ROOT = Path(__file__).resolve().parents[2]


def _crd() -> dict[str, Any]:
    return crdgen.workerpool_crd()


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_names_scope_and_subresources() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "workerpools.cronwell.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "WorkerPool",
        "workerpools",
        ["wp"],
        ["cronwell"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    # status only: the operator scales the *Deployment's* scale subresource, not the pool's.
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}


def test_printer_columns_point_at_real_fields() -> None:
    cols = _crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"].upper() for c in cols if not c.get("priority")]
    assert default == [
        "TARGET",
        "MIN",
        "MAX",
        "DESIRED",
        "CURRENT",
        "NEXT BURST",
        "BURST SIZE",
        "AGE",
    ]
    for col in cols:
        if col["jsonPath"] == ".metadata.creationTimestamp":
            continue
        node = _schema()
        for part in col["jsonPath"].lstrip(".").split("."):
            node = node["properties"][part]
        want = {"integer": "integer", "string": "string", "boolean": "boolean"}[col["type"]]
        assert node["type"] == want, col


def test_max_ge_min_is_a_cel_rule_with_the_models_message() -> None:
    spec = _schema()["properties"]["spec"]
    (rule,) = spec["x-kubernetes-validations"]
    assert rule["rule"] == "self.maxReplicas >= self.minReplicas"
    with pytest.raises(pydantic.ValidationError) as exc:
        WorkerPoolSpec.model_validate(
            {"scaleTargetRef": {"name": "w"}, "minReplicas": 5, "maxReplicas": 2}
        )
    assert rule["message"] in str(exc.value)


def test_name_rule_and_required_target() -> None:
    assert crdgen.NAME_RULE in _schema()["x-kubernetes-validations"]
    spec = _schema()["properties"]["spec"]
    assert spec["required"] == ["scaleTargetRef"]
    target = spec["properties"]["scaleTargetRef"]
    assert target["required"] == ["name"]
    assert target["properties"]["kind"]["enum"] == ["Deployment"]
    assert target["properties"]["apiVersion"]["enum"] == ["apps/v1"]


def test_crd_defaults_equal_pydantic_defaults() -> None:
    """What the API server fills in is what the operator's model assumes."""
    minimal = {"scaleTargetRef": {"name": "cronwell-worker-default"}}
    defaulted = _apply_defaults(_schema()["properties"]["spec"], copy.deepcopy(minimal))
    assert defaulted["startSLOSeconds"] == 5.0
    assert defaulted["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "cronwell-worker-default",
    }
    model = WorkerPoolSpec.model_validate(minimal)
    assert WorkerPoolSpec.model_validate(defaulted) == model
    assert model.model_dump(mode="json", by_alias=True, exclude_none=True) == defaulted


def test_status_round_trips_through_the_schema_names() -> None:
    status = WorkerPoolStatus.model_validate(
        {
            "desiredReplicas": 4,
            "currentReplicas": 1,
            "nextBurst": {"time": "2030-01-01T00:00:00Z", "size": 50000},
            "lastPreScale": {
                "time": "2029-12-31T23:59:00Z",
                "replicas": 4,
                "burstTime": "2030-01-01T00:00:00Z",
                "landedBeforeBurst": True,
            },
            "conditions": [{"type": "TargetFound", "status": "True", "reason": "Found"}],
        }
    )
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    props = _schema()["properties"]["status"]["properties"]
    assert set(dumped) - {"conditions"} <= set(props)
    assert set(dumped["lastPreScale"]) <= set(props["lastPreScale"]["properties"])


def test_examples_are_valid_workerpools() -> None:
    files = sorted((ROOT / "examples" / "workerpools").glob("*.yaml"))
    assert files
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            pool = WorkerPool.model_validate(doc)
            assert pool.spec.max_replicas >= pool.spec.min_replicas
