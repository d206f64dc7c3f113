"""cronwell.store.db.row_class: a row type behaves as the frozen slots dataclass it replaced
(equality, hashing, fields, replace, inheritance, no per-instance dict), built without the
frozen guard's per-field `object.__setattr__`."""

from __future__ import annotations

import dataclasses

import pytest

from cronwell.dispatch import Claimed
from cronwell.store.claims import Started
from cronwell.store.db import row_class


@row_class
class _Row:
    a: int
    b: str = "x"


@row_class
class _Wider(_Row):
    c: float = 0.0


def test_rows_compare_and_hash_by_value_as_frozen_dataclasses_do() -> None:
    assert _Row(1) == _Row(1, "x") and _Row(1) != _Row(2)
    assert hash(_Row(1)) == hash(_Row(1, "x"))
    assert len({_Row(1), _Row(1), _Row(2)}) == 2


def test_rows_are_dataclasses_with_slots_and_inherit_fields() -> None:
    w = _Wider(1, "y", 2.5)
    assert [f.name for f in dataclasses.fields(w)] == ["a", "b", "c"]
    assert dataclasses.replace(w, c=3.0) == _Wider(1, "y", 3.0)
    with pytest.raises(AttributeError):
        w.__dict__  # noqa: B018 - slots: no per-instance dict


def test_the_claims_rows_are_row_classes_not_frozen_dataclasses() -> None:
    """A frozen dataclass's __init__ goes through object.__setattr__ per field (1.9 us for
    a 19-field row): the claim's per-occurrence rows must not pay it."""
    for cls in (Started, Claimed):
        params = getattr(cls, "__dataclass_params__")  # noqa: B009
        assert not params.frozen, cls
        assert cls.__hash__ is not None, cls
