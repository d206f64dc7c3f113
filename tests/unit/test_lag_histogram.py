"""The start-lag histogram is exposed exactly as prometheus_client's Histogram would expose
the same observations: dashboards and alerts read its buckets by `le`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from cronwell.metrics import _LAG_BUCKETS, Metrics

# Below the first bound, on bounds (a value equal to a bound counts in its bucket: `le`),
# between bounds, beyond the last one, and negative (a clock step).
LAGS = [0.0, 0.004, 0.01, 0.0100001, 0.3, 1, 1.0, 2.5, 300, 300.5, 1e6, -0.2]


def _samples(registry: CollectorRegistry) -> list[tuple[str, list[tuple[str, str]], float]]:
    return sorted(
        (s.name, sorted(s.labels.items()), s.value)
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    )


def test_start_lags_are_exposed_as_a_prometheus_histogram_would_expose_them() -> None:
    m = Metrics()
    peer = CollectorRegistry()
    expected = Histogram(
        "cronwell_start_lag_seconds", "peer", ["pool"], buckets=_LAG_BUCKETS, registry=peer
    )
    for pool, lags in (("a", LAGS), ("b", LAGS[:3])):
        for lag in lags:
            m.start_lag.labels(pool).observe(lag)
            expected.labels(pool).observe(lag)
    ours = [s for s in _samples(m.registry) if s[0].startswith("cronwell_start_lag_seconds")]
    assert ours == _samples(peer)
    assert m.registry.get_sample_value("cronwell_start_lag_seconds_count", {"pool": "a"}) == len(
        LAGS
    )
    assert m.registry.get_sample_value(
        "cronwell_start_lag_seconds_bucket", {"pool": "a", "le": "0.01"}
    ) == sum(1 for v in LAGS if v <= 0.01)


def test_a_pool_without_starts_exposes_no_series() -> None:
    m = Metrics()
    assert m.registry.get_sample_value("cronwell_start_lag_seconds_count", {"pool": "a"}) is None
