"""The benchmarks run only by hand (`make bench`): this keeps each of their modules
importable, so a moved or renamed name fails here rather than in a 35-minute run."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("module", sorted(f.stem for f in BENCH.glob("*.py")))
def test_bench_module_imports(module: str) -> None:
    assert importlib.import_module(f"bench.{module}").__doc__
