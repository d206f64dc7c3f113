"""The Grafana dashboard and the PrometheusRule only use series cronwell really exposes
(names as Prometheus sees them: counters end in `_total`, histograms in `_bucket`, `_sum`,
`_count`), and the README describes every panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cronwell.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "cronwell" / "dashboards" / "cronwell.json"
RULES = ROOT / "charts" / "cronwell" / "templates" / "prometheusrule.yaml"
NAME = re.compile(r"\bcronwell_[a-z_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def exposed() -> set[str]:
    """Every series name a scrape of any cronwell process can return."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_exposed_names_follow_prometheus_conventions() -> None:
    names = exposed()
    assert "cronwell_occurrences_total" in names and "cronwell_occurrences" not in names
    assert "cronwell_start_lag_seconds_bucket" in names
    assert "cronwell_dlq_size" in names


def test_dashboard_uses_only_exposed_metrics() -> None:
    names = exposed()
    doc = dashboard()
    queries = [t["expr"] for p in panels() for t in p["targets"]]
    queries += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    used = {m for q in queries for m in NAME.findall(q)}
    assert used, "no cronwell metric found in the dashboard"
    assert used <= names, f"the dashboard queries series nothing exposes: {sorted(used - names)}"


def test_dashboard_shows_the_operator_and_prescaling() -> None:
    used = {m for p in panels() for t in p["targets"] for m in NAME.findall(t["expr"])}
    for name in (
        "cronwell_operator_status_backlog",
        "cronwell_operator_api_requests_total",
        "cronwell_planned_replicas",
        "cronwell_pool_replicas",
        "cronwell_prescale_lead_seconds",
    ):
        assert name in used, name


def test_dashboard_panels_are_well_formed() -> None:
    doc = dashboard()
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels():
        assert p.get("description"), f"panel {p['title']!r} has no description"
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert 'namespace="$namespace"' in t["expr"], (p["title"], t["expr"])
            assert t["expr"].count("(") == t["expr"].count(")"), (p["title"], t["expr"])


def test_alert_rules_use_only_exposed_metrics() -> None:
    text = RULES.read_text()
    exprs = re.findall(r"expr: \|-\n((?:[ ]{12,}.*\n)+)", text)
    assert len(exprs) == text.count("- alert:"), "an alert expression was not found"
    used = {m for e in exprs for m in NAME.findall(e)}
    names = exposed()
    assert used and used <= names, f"alerts query series nothing exposes: {sorted(used - names)}"


def test_readme_describes_every_panel() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Grafana dashboard\n", 1)
    assert len(section) == 2, "README.md has no '## Grafana dashboard' section"
    body = section[1].split("\n## ", 1)[0]
    missing = [p["title"] for p in panels() if f"**{p['title']}**" not in body]
    assert not missing, f"README's Grafana dashboard section does not describe {missing}"
