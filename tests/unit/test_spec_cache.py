"""The scheduler's parsed specs: read once per hash, and a hash evicted mid-batch is read
again by the next batch rather than parking its job."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from cronwell.scheduler import SpecCache
from cronwell.store.materialise import DueJob

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def due(spec_hash: str) -> DueJob:
    return DueJob(uuid.uuid4(), spec_hash, "default", NOW, None, NOW)


def document(message: str) -> dict[str, Any]:
    return {"schedule": "* * * * * *", "target": {"log": {"message": message}}}


def test_only_unparsed_hashes_are_read_one_job_each() -> None:
    cache = SpecCache()
    a1, a2, b = due("a"), due("a"), due("b")
    assert cache.unread([a1, a2, b]) == [a1.id, b.id]
    found = cache.get(a2.id, "a", {"a": document("a"), "b": document("b")})
    assert found is not None and found[0].target.log is not None
    assert found[0].target.log.message == "a"
    assert cache.unread([a1, b]) == [b.id]
    again = cache.get(a1.id, "a", {})  # parsed: no document needed
    assert again is not None and again[0] is found[0] and again[1] is found[1]


def test_a_hash_evicted_since_unread_waits_for_the_next_batch() -> None:
    cache = SpecCache(size=1)
    a, b = due("a"), due("b")
    read = {"a": document("a"), "b": document("b")}
    assert cache.unread([a, b]) == [a.id, b.id]
    assert cache.get(a.id, "a", read) is not None
    assert cache.get(b.id, "b", read) is not None  # evicts "a"
    assert cache.get(a.id, "a", {}) is None  # not parsed, not read: skipped, not parked
    assert cache.unread([a]) == [a.id]
