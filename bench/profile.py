"""Profile shares from py-spy raw (collapsed) stacks of the burst's worker processes.

Each line of a raw file is `frame;frame;...;leaf COUNT`, a frame `func (path:line)`.
Reported: share of samples idle (event loop waiting in select/epoll), self time by
package/module (leaf frame), and inclusive time of cronwell functions and a few known
costs (pydantic validation, psycopg, prometheus metrics, logging, asyncio task creation).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
