"""Claim: the client's CPU for cronwell's claim, measured in this process.

N occurrences materialised as for the burst (due in `lead` s), claimed by `dispatch.claim`
as a worker claims them ahead (batches of the worker's default claim batch, a window that
covers them all), with no worker and no handler: the process's CPU per occurrence, and
each store call's share (a CPU timer around each of `STEPS` for the run's duration). Then
the same N claimed by the tasks driver's single statement (`ceiling.TASKS_CLAIM`, three
columns a row): what the claim's overlap decisions, its 18-column row and the specs add
to the bare SQL on the client. Found the session's time zone in psycopg's loading of every
timestamp (bench/README.md, "Sessions in UTC")."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import burst, ceiling
from cronwell import dispatch
from cronwell.settings import WorkerSettings
from cronwell.store import Database, claims

STEPS: tuple[tuple[Any, str], ...] = (
    (claims, "take_turn"),
    (claims, "candidates"),
    (claims, "lock_jobs"),
    (claims, "active"),
    (claims, "start"),
    (dispatch, "decide"),
    (dispatch, "attach_specs"),
)


@contextlib.contextmanager
def _timed(spent: dict[str, float]) -> Iterator[None]:
    """Each of STEPS wrapped by a CPU timer adding to `spent`; put back on exit."""
    saved = [(mod, name, getattr(mod, name)) for mod, name in STEPS]

    def sync(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def g(*a: Any, **k: Any) -> Any:
            c = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[name] += time.process_time() - c

        return g

    def coro(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        async def g(*a: Any, **k: Any) -> Any:
            c = time.process_time()
            try:
                return await f(*a, **k)
            finally:
                spent[name] += time.process_time() - c

        return g

    for mod, name, f in saved:
        setattr(mod, name, (coro if inspect.iscoroutinefunction(f) else sync)(name, f))
    try:
        yield
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)


async def claim_cpu(db: Database, n: int, lead: float) -> dict[str, Any]:
    """The section's figures (module docstring), in ms of client CPU per occurrence."""
    batch = int(WorkerSettings.model_fields["claim_batch_size"].default)
    await burst.prepare_burst(db, n, lead)
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    got = 0
    known: set[str] = set()  # as a worker's parsed specs: each spec read once
    with _timed(spent):
        cpu0 = time.process_time()
        while claimed := await dispatch.claim(
            db,
            pool="default",
            worker_id="bench-claim",
            limit=batch,
            lease_seconds=60,
            known_specs=known,
            ahead_seconds=lead + 60,
        ):
            got += len(claimed)
            known.update(c.spec_hash for c in claimed)
        cpu = time.process_time() - cpu0
    await burst.prepare_burst(db, n, lead)
    bare = 0
    async with db.connection() as conn:
        cpu1 = time.process_time()
        while True:
            cur = await conn.execute(
                ceiling.TASKS_CLAIM, {"w": "bench-claim", "b": batch, "ahead": lead + 60}
            )
            rows = await cur.fetchall()
            if not rows:
                break
            bare += len(rows)
        bare_cpu = time.process_time() - cpu1
    return {
        "occurrences": n,
        "claimed": got,
        "batch": batch,
        "claim_cpu_ms_per_occurrence": round(1000 * cpu / max(got, 1), 4),
        "steps_cpu_ms_per_occurrence": {
            k: round(1000 * v / max(got, 1), 4) for k, v in spent.items()
        },
        "bare_claimed": bare,
        "bare_claim_cpu_ms_per_occurrence": round(1000 * bare_cpu / max(bare, 1), 4),
    }
