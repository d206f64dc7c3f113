"""Every runtime query is named, commented and parseable; every name used exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cronwell.store._queries import parse, queries

ROOT = Path(__file__).resolve().parents[2]


def test_every_query_has_a_description() -> None:
    for name, sql in queries().items():
        first = sql.splitlines()[0]
        assert first.startswith("-- ") and len(first) > 10, name
        assert re.match(r"^[A-Z][a-zA-Z]+$", name), name


def test_names_used_in_code_exist_and_all_are_used() -> None:
    used: set[str] = set()
    for f in [
        *ROOT.glob("cronwell/**/*.py"),
        *ROOT.glob("worker/**/*.py"),
        *ROOT.glob("operator/**/*.py"),
    ]:
        used |= set(re.findall(r'"([A-Z][a-z]+(?:[A-Z][a-z]+)+)"', f.read_text()))
    known = set(queries())
    referenced = used & known
    assert referenced == known, f"unused queries: {sorted(known - referenced)}"


def test_parse_rejects_duplicates_and_missing_descriptions() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        parse("-- name: A\n-- a\nSELECT 1;\n-- name: A\n-- a\nSELECT 2;")
    with pytest.raises(ValueError, match="description"):
        parse("-- name: A\nSELECT 1;")
