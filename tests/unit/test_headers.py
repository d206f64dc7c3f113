"""The headers field: the list shape with Secret references, the first (map) shape still
loading, and the rules a reference must follow (its own namespace only)."""

from __future__ import annotations

import pydantic
import pytest

from cronwell.loader import format_validation_error
from cronwell.models import HttpTarget


def _errors(headers: object) -> str:
    with pytest.raises(pydantic.ValidationError) as e:
        HttpTarget.model_validate({"url": "https://api.example.com", "headers": headers})
    return format_validation_error(e.value)


def test_the_map_shape_still_loads_as_literal_values() -> None:
    t = HttpTarget.model_validate({"url": "https://x.example", "headers": {"X-A": "1"}})
    assert [(h.name, h.value, h.value_from) for h in t.headers] == [("X-A", "1", None)]
    assert t.model_dump(by_alias=True, exclude_none=True)["headers"] == [
        {"name": "X-A", "value": "1"}
    ]


def test_a_secret_reference() -> None:
    ref = {"secretKeyRef": {"name": "api-token", "key": "token"}}
    t = HttpTarget.model_validate(
        {"url": "https://x.example", "headers": [{"name": "Authorization", "valueFrom": ref}]}
    )
    assert [h.name for h in t.secret_headers] == ["Authorization"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k",
                                                          "namespace": "other"}}}],
            "unknown field 'namespace'",  # another namespace's Secret cannot be named
        ),
        ([{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
         "header 'A': set exactly one of value or valueFrom"),
        ([{"name": "A"}], "header 'A': set exactly one of value or valueFrom"),
        ([{"name": "A", "value": "1"}, {"name": "a", "value": "2"}],
         "header 'a' is given twice: keep one"),
        ([{"name": "Bad Name", "value": "1"}], "headers.0.name: String should match pattern"),
        ([{"name": f"H{i}", "value": "v"} for i in range(65)], "at most 64 items"),
    ],
)  # fmt: skip
def test_invalid_headers(headers: object, message: str) -> None:
    assert message in _errors(headers)
