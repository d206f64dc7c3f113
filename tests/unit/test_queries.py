"""Every runtime query is named, commented and parseable; every name used exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cronwell.store._queries import parse, queries, queries_by_file

ROOT = Path(__file__).resolve().parents[2]


def test_every_query_has_a_description() -> None:
    for name, sql in queries().items():
        first = sql.splitlines()[0]
        assert first.startswith("-- ") and len(first) > 10, name
        assert re.match(r"^[A-Z][a-zA-Z]+$", name), name


def test_array_parameters_are_sent_in_binary() -> None:
    """`%(x)b::type[]`, never `%(x)s::type[]`: in text format psycopg dumps a list element
    by element in Python, quoting each (a materialisation batch's 12 arrays: 12 us an
    occurrence, 44 % of the scheduler's CPU at 10,000 per-second jobs); in binary 2 us."""
    text = [
        (name, m.group(0))
        for name, sql in queries().items()
        for m in re.finditer(r"%\(\w+\)s::[a-z ]+\[\]", sql)
    ]
    assert not text, text


_SOURCES = ("cronwell/**/*.py", "worker/**/*.py", "operator/**/*.py", "bench/*.py")
_STORE = ROOT / "cronwell" / "store"
# The Database methods whose first argument is a query name (`rows`/`row`: the second).
_RUNNERS = {"fetch", "fetchone", "execute", "scalar", "q", "rows", "row"}


def query_names_called(source: str) -> set[str]:
    """Literal query names passed to the store (`db.fetch("JobList", ...)` and wrappers)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        # `db.rows(Row, "Name", ...)`: the name comes after the row class.
        arg = node.args[1] if callee in {"rows", "row"} and len(node.args) > 1 else node.args[0]
        if (
            callee in _RUNNERS
            and isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+", arg.value)
        ):
            names.add(arg.value)
    return names


def query_names_tabled(source: str) -> set[str]:
    """Query names held as the values of a dict a store function picks one from
    (`ui.JOB_SORTS`: one query per sort order)."""
    return {
        v.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Dict)
        for v in node.values
        if isinstance(v, ast.Constant)
        and isinstance(v.value, str)
        and re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+", v.value)
    }


def test_names_used_in_code_exist_and_all_are_used() -> None:
    """Both ways: a query name the store runs must exist (a typo fails here, not in
    production), and every query must be run by some store function."""
    called: set[str] = set()
    for f in _STORE.glob("*.py"):
        called |= query_names_called(f.read_text()) | query_names_tabled(f.read_text())
    known = set(queries())
    assert called, "no query call found: the scan is broken"
    assert called <= known, f"unknown query names called: {sorted(called - known)}"
    assert called >= known, f"unused queries: {sorted(known - called)}"


def test_each_table_module_runs_only_the_queries_beside_it() -> None:
    """`store/jobs.py` runs the queries of `store/jobs.sql`, and no code outside the store
    runs a query by name: one place to read a table's SQL and the functions that call it."""
    store = _STORE
    by_file = queries_by_file()
    owner = {name: stem for stem, named in by_file.items() for name in named}
    for stem in by_file:
        module = store / f"{stem}.py"
        assert module.exists(), f"{stem}.sql has no {stem}.py beside it"
        called = query_names_called(module.read_text())
        foreign = {n: owner.get(n) for n in called if owner.get(n) != stem}
        assert not foreign, f"{stem}.py runs queries of other files: {foreign}"
    for pattern in _SOURCES:
        for f in ROOT.glob(pattern):
            if f.parent == store:
                continue
            stray = query_names_called(f.read_text())
            assert not stray, f"{f.relative_to(ROOT)} runs queries by name: {stray}"


def test_a_mistyped_query_name_is_caught() -> None:
    source = 'async def f(db):\n    await db.fetch("JobLsit", {})\n'
    assert query_names_called(source) == {"JobLsit"}
    assert "JobLsit" not in queries()


def test_parse_rejects_duplicates_and_missing_descriptions() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        parse("-- name: A\n-- a\nSELECT 1;\n-- name: A\n-- a\nSELECT 2;")
    with pytest.raises(ValueError, match="description"):
        parse("-- name: A\nSELECT 1;")
