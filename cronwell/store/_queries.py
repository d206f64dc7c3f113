"""Loads the named queries of the store's SQL files (`-- name: X` then a `--` description line).

Each table module (`jobs.py`) keeps its queries next to it (`jobs.sql`); names are unique
across files so a query is found by name alone. Array parameters are written
`%(x)b::type[]`: sent in binary, which psycopg dumps several times faster than text (it
quotes each element of a text array in Python: 44 % of the scheduler's CPU at 10,000
per-second jobs; tests/unit/test_queries.py keeps the rule)."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import LiteralString, cast

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, LiteralString]:
    """Split a SQL file into {name: query}; the description comment stays in the query."""
    parts = _NAME.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"duplicate query name {name}")
        lines = body.strip().splitlines()
        if not lines or not lines[0].startswith("--"):
            raise ValueError(f"query {name} lacks its one-line description comment")
        queries[name] = cast(LiteralString, body.strip())
    return queries


@functools.cache
def queries_by_file() -> dict[str, dict[str, LiteralString]]:
    """{file stem: {name: query}} for every `*.sql` beside the store's modules."""
    files = sorted(
        (f for f in resources.files("cronwell.store").iterdir() if f.name.endswith(".sql")),
        key=lambda f: f.name,
    )
    return {f.name.removesuffix(".sql"): parse(f.read_text()) for f in files}


@functools.cache
def queries() -> dict[str, LiteralString]:
    merged: dict[str, LiteralString] = {}
    for stem, named in queries_by_file().items():
        for name, sql in named.items():
            if name in merged:
                raise ValueError(f"query {name} is defined twice (again in {stem}.sql)")
            merged[name] = sql
    return merged


def q(name: str) -> LiteralString:
    return queries()[name]
