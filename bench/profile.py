"""Profile: where a burst's time goes, in the workers and in PostgreSQL.

The burst again (`--profile-jobs`, the worker's default claim ahead) with py-spy sampling
each worker process from just before T, and pg_stat_statements (the bench server loads it
when this section runs) reset just before it. Reported:

- from py-spy's raw (collapsed) stacks (each line `frame;frame;...;leaf COUNT`, a frame
  `func (path:line)`): share of samples idle (event loop waiting in select/epoll), self
  time by package/module (leaf frame), inclusive time of cronwell functions and a few
  known costs (pydantic validation, psycopg, prometheus metrics, logging, asyncio tasks);
- PostgreSQL: execution time per statement (top by total), per occurrence of the burst;
- CPU per occurrence (workers, PostgreSQL: psutil) and the physical floor it implies:
  CPU-seconds per occurrence x N / cores, and that floor at 50,000.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import enable_statements, per_occurrence, statements
from cronwell.store import Database
from cronwell.store._queries import queries

FRAME = re.compile(r"^(?P<func>.*?) \((?P<path>[^():]+)(?::\d+)?\)$")

MARKERS: dict[str, Callable[[str, str], bool]] = {
    "pydantic validation": lambda f, p: "pydantic" in p,
    "psycopg (driver + pool)": lambda f, p: "/psycopg" in p,
    "prometheus metrics": lambda f, p: "prometheus_client" in p,
    "logging": lambda f, p: "/logging/" in p,
    "asyncio create_task/Task": lambda f, p: f in ("create_task", "__init__") and "tasks" in p,
    "asyncio wait_for": lambda f, p: f == "wait_for" and "asyncio" in p,
    "json": lambda f, p: "/json/" in p,
    "httpx (client setup)": lambda f, p: "/httpx" in p,
}


def _module(path: str) -> str:
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    for top in ("cronwell_worker", "cronwell"):
        m = re.search(rf"(^|/){top}/([^/]+)", path)
        if m:
            return f"{top}/{m.group(2)}"
    m = re.search(r"python3\.\d+/([^/]+)", path)
    if m:
        return "stdlib " + m.group(1).removesuffix(".py")
    return path


def _entry(path: str) -> bool:
    """A command-line frame (cronwell/cli/, cronwell_worker/cli.py): it holds every sample
    under it, so its inclusive share says nothing."""
    return "/cli/" in path or path.endswith("cli.py")


def analyse(files: list[Path], top: int = 15) -> dict[str, Any]:
    total = idle = 0
    self_mod: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    incl_marker: Counter[str] = Counter()
    for file in files:
        for line in file.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            count = int(n)
            frames = []
            for fr in stack.split(";"):
                m = FRAME.match(fr.strip())
                frames.append((m.group("func"), m.group("path")) if m else (fr, ""))
            total += count
            leaf_f, leaf_p = frames[-1]
            if leaf_f in ("select", "poll", "epoll") or "selectors" in leaf_p:
                idle += count
                continue
            self_mod[_module(leaf_p) if leaf_f.strip() else "<no python frame>"] += count
            seen: set[str] = set()
            for f, p in frames:
                if "cronwell" in p and f != "<module>" and not _entry(p):
                    key = f"{_module(p)}:{f}"
                    if key not in seen:
                        seen.add(key)
                        incl_fn[key] += count
            for name, test in MARKERS.items():
                if any(test(f, p) for f, p in frames):
                    incl_marker[name] += count
    busy = max(total - idle, 1)

    def share(c: Counter[str]) -> dict[str, float]:
        return {k: round(100 * v / busy, 1) for k, v in c.most_common(top)}

    return {
        "samples": total,
        "idle_pct_of_samples_py_spy_skips_idle": round(100 * idle / max(total, 1), 1),
        "busy_self_pct_by_module": share(self_mod),
        "busy_inclusive_pct_cronwell_functions": share(incl_fn),
        "busy_inclusive_pct_known_costs": share(incl_marker),
    }


def _stacks(pdir: Path, clear: bool = False) -> list[Path]:
    """py-spy's files of the last profile (`clear`: delete those of an earlier one)."""
    files = sorted(pdir.glob("worker-*.txt"))
    if clear:
        for f in files:
            f.unlink()
    return files


CONSTANTS = frozenset({"true", "false", "null"})
"""Keywords pg_stat_statements shows as $n, like any other constant."""


def shape(sql: str) -> tuple[str, ...]:
    """A statement's words, without comments, literals and parameters: the same for a named
    query and its pg_stat_statements row (which drops leading comments and shows every
    constant, true, false and NULL included, and parameter as $n)."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"'(?:[^']|'')*'|%\(\w+\)[sb]|\$\d+", " ", sql)
    words = re.findall(r"[A-Za-z_][A-Za-z_0-9]*", sql.lower())
    return tuple(w for w in words if w not in CONSTANTS)


def name_of(text: str, named: dict[tuple[str, ...], str]) -> str | None:
    """The named query a pg_stat_statements row is, or None: the bench's own or the
    driver's (BEGIN, COMMIT)."""
    return named.get(shape(text))


async def per_query(db: Database, n: int) -> dict[str, Any]:
    """Statements, rows and execution time per occurrence of the burst, per named query
    (pg_stat_statements since the burst's reset). Counts are exact and repeatable; the
    times are indicative only on a shared machine. With pg_stat_statements.track = all
    (`track_nested`), the statements that triggers and functions run are listed too, as
    "(nested)": their rows are writes the named queries cause; their time is inside their
    caller's, so the totals leave them out."""
    named = {shape(sql): name for name, sql in queries().items()}
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT query, toplevel, calls, rows, total_exec_time AS ms FROM pg_stat_statements"
        )
        rows = await cur.fetchall()
    by: dict[str, list[float]] = {}
    for r in rows:
        text = " ".join(r["query"].split())[:60]
        name = (
            (name_of(r["query"], named) or f"(other) {text}")
            if r["toplevel"]
            else (f"(nested) {text}")
        )
        acc = by.setdefault(name, [0, 0, 0.0])
        acc[0] += r["calls"]
        acc[1] += r["rows"]
        acc[2] += float(r["ms"])
    ours = {k: v for k, v in by.items() if not k.startswith("(")}
    nested = {k: v for k, v in by.items() if k.startswith("(nested)")}
    top = [v for k, v in by.items() if k not in nested]
    return {
        "occurrences": n,
        "named_statements_per_occurrence": round(sum(v[0] for v in ours.values()) / n, 4),
        "named_rows_per_occurrence": round(sum(v[1] for v in ours.values()) / n, 4),
        "named_exec_ms_per_occurrence": round(sum(v[2] for v in ours.values()) / n, 4),
        "nested_statements_per_occurrence": round(sum(v[0] for v in nested.values()) / n, 4),
        "nested_rows_per_occurrence": round(sum(v[1] for v in nested.values()) / n, 4),
        "all_exec_ms_per_occurrence": round(sum(v[2] for v in top) / n, 4),
        "per_query": {
            k: {
                "calls": int(v[0]),
                "statements_per_occurrence": round(v[0] / n, 4),
                "rows_per_occurrence": round(v[1] / n, 4),
                "exec_ms_per_occurrence": round(v[2] / n, 4),
                "ms_per_call": round(v[2] / max(v[0], 1), 3),
            }
            for k, v in sorted(by.items(), key=lambda kv: -kv[1][2])
        },
    }


async def prepare(db: Database, pdir: Path) -> None:
    """Before the profiled burst: py-spy files of an earlier run deleted, the extension on
    (the server loads the library when this section runs)."""
    _stacks(pdir, clear=True)
    await enable_statements(db)


def table(counts: dict[str, Any]) -> str:
    """`per_query`'s figures as a table to read (statements, rows, ms per occurrence)."""
    out = [f"{'query':<44} {'stmts/occ':>10} {'rows/occ':>10} {'ms/occ':>9} {'ms/call':>9}"]
    for name, f in counts["per_query"].items():
        out.append(
            f"{name[:44]:<44} {f['statements_per_occurrence']:>10.4f}"
            f" {f['rows_per_occurrence']:>10.4f} {f['exec_ms_per_occurrence']:>9.4f}"
            f" {f['ms_per_call']:>9.3f}"
        )
    out.append(
        f"{'named queries, total':<44} {counts['named_statements_per_occurrence']:>10.4f}"
        f" {counts['named_rows_per_occurrence']:>10.4f}"
        f" {counts['named_exec_ms_per_occurrence']:>9.4f}"
    )
    out.append(
        f"{'nested, total':<44} {counts['nested_statements_per_occurrence']:>10.4f}"
        f" {counts['nested_rows_per_occurrence']:>10.4f}"
    )
    return "\n".join(out)


async def summary(db: Database, figs: dict[str, Any], pdir: Path) -> dict[str, Any]:
    """After the burst (`figs`, run with py-spy writing to `pdir`): the shares, PostgreSQL's
    time per statement, the CPU per occurrence and the floor it implies."""
    n = figs["occurrences"]
    stmts = per_occurrence(await statements(db), n)
    cpu_ms = figs.get("worker_cpu_ms_per_occurrence", 0) + figs.get(
        "postgres_cpu_ms_per_occurrence", 0
    )
    cores = os.cpu_count() or 1
    return {
        "occurrences": n,
        "claim_ahead_s": figs.get("claim_ahead_s"),
        "per_second_under_py_spy": figs.get("per_second"),
        "start_lag_p99_s": figs.get("start_lag_p99_s"),
        "handler_start_lag_p99_s": figs.get("handler_start_lag_p99_s"),
        "all_succeeded_after_s": figs.get("all_succeeded_after_s"),
        "worker_cpu_ms_per_occurrence": figs.get("worker_cpu_ms_per_occurrence"),
        "postgres_cpu_ms_per_occurrence": figs.get("postgres_cpu_ms_per_occurrence"),
        "cpu_floor_s": figs.get("cpu_floor_s"),
        "cpu_floor_at_50000_s": round(cpu_ms * 50_000 / 1000 / cores, 2),
        "postgres": stmts,
    } | analyse(_stacks(pdir))
