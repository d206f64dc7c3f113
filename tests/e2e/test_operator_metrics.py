"""The operator's own metrics, scraped from its /metrics while the real API server calls its
webhook and its handlers and status writer work: the values follow what happened."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.controlplane import Cluster, KubectlError, free_port
from cronwell_operator.testing import (
    OperatorProcess,
    create_database,
    wait_until,
)
from tests.helpers.kube import operator_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def operator(
    kube: Cluster,
    ns: str,
    pg_server: EmbeddedPostgres,
    template_db: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[OperatorProcess, int]]:
    store = create_database(pg_server.port, template_db, f"om_{uuid.uuid4().hex[:8]}")
    tmp = tmp_path_factory.mktemp("opmetrics")
    port = free_port()
    args = operator_args(ns, "--metrics-port", str(port))
    args += ["--webhook-port", str(free_port()), "--webhook-addr", "127.0.0.1"]
    args += ["--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(tmp / "certs")]
    op = OperatorProcess(kube.kubeconfig, store, tmp / "operator.log", args=args)
    try:
        op.start().wait_ready(120)
        wait_until(lambda: _accepts(kube, ns), 60, "the webhook answering", check=op._alive)
        yield op, port
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)
    finally:
        op.stop()
        kube.kubectl("delete", "validatingwebhookconfiguration", "cronwell.dev", check=False)


def sj(name: str, schedule: str) -> str:
    return (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        f'spec: {{schedule: "{schedule}", target: {{log: {{}}}}}}\n'
    )


def _accepts(kube: Cluster, ns: str) -> bool:
    out = kube.kubectl(
        "apply", "--dry-run=server", "-n", ns, "-f", "-", input=sj("probe", "@yearly"), check=False
    )
    return out.returncode == 0


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
          ) -> float:  # fmt: skip
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_follow_reconciles_admissions_and_status_writes(
    kube: Cluster, ns: str, operator: tuple[OperatorProcess, int]
) -> None:
    op, port = operator
    before = scrape(port)
    assert value(before, "cronwell_operator_leader") == 1
    allowed0 = value(before, "cronwell_operator_admissions_total", result="allowed", reason="none")
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("counted", "@hourly"))

    def moved() -> dict[Any, float] | None:
        now = scrape(port)
        ok = (
            value(now, "cronwell_operator_reconciles_total", outcome="applied") >= 1
            # The Ready condition written for the new job: one status patch.
            and value(now, "cronwell_operator_api_requests_total", kind="status_patch") >= 1
        )
        return now if ok else None

    after = wait_until(moved, 60, "reconcile and status metrics moving", check=op._alive)
    # The lag is sampled by a write that carries logged changes. The first write of a new CR
    # may come from the handler's touch before its change row is read (then no sample, and
    # the row finds the status current): a spec change is written from its logged row
    # (observedGeneration moves), so it is sampled.
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("counted", "@daily"))
    wait_until(
        lambda: value(scrape(port), "cronwell_operator_status_lag_seconds_count") >= 1,
        60,
        "a status lag sample",
        check=op._alive,
    )
    assert (
        value(after, "cronwell_operator_admissions_total", result="allowed", reason="none")
        > allowed0
    )
    assert value(after, "cronwell_operator_status_backlog") >= 0
    assert ("cronwell_operator_status_backlog", frozenset()) in after

    # A refused apply counts as denied, with its reason class.
    with pytest.raises(KubectlError):
        kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("bad", "61 * * * *"))
    assert value(scrape(port), "cronwell_operator_admissions_total", result="denied",
                 reason="spec") == 1  # fmt: skip

    # A delete counts as deleted.
    kube.kubectl("delete", "sj", "counted", "-n", ns, "--timeout=60s")
    wait_until(
        lambda: value(scrape(port), "cronwell_operator_reconciles_total", outcome="deleted") >= 1,
        60,
        "the delete counted",
        check=op._alive,
    )
    crs = json.loads(kube.kubectl("get", "sj", "-n", ns, "-o", "json").stdout)["items"]
    assert [c["metadata"]["name"] for c in crs] == []
