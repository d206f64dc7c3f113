"""Loads the named queries of queries.sql (`-- name: X` then a `--` description line)."""

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
def queries() -> dict[str, LiteralString]:
    return parse(resources.files("cronwell.store").joinpath("queries.sql").read_text())


def q(name: str) -> LiteralString:
    return queries()[name]
