"""The dashboard's review cache: what docs/ui.md promises about it (an answer is used for
`ttl` seconds after it was put, then asked again; the oldest entry goes first when full)."""

from __future__ import annotations

from cronwell.ui.auth import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_ttl_seconds_from_its_put_and_reading_does_not_extend_it() -> None:
    clock = Clock()
    cache: TtlCache[str, bool] = TtlCache(30, 10, clock)
    cache.put("k", True)
    clock.now += 29.9
    assert cache.get("k") is True
    clock.now += 0.1
    assert cache.get("k") is None and len(cache) == 0
    cache.put("k", False)  # a denial is an answer too: cached, not mistaken for a miss
    assert cache.get("k") is False


def test_the_oldest_entry_goes_first_when_full() -> None:
    cache: TtlCache[int, int] = TtlCache(30, 2, Clock())
    for i in range(3):
        cache.put(i, i)
    assert (cache.get(0), cache.get(1), cache.get(2)) == (None, 1, 2) and len(cache) == 2
    cache.put(1, 10)  # a put renews its place
    cache.put(3, 3)
    assert (cache.get(1), cache.get(2), cache.get(3)) == (10, None, 3)
