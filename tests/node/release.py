"""The chart installed as users install it, shared by the node test modules (conftest.py
imports the fixtures, so one session has one image import, one database and one
`helm install`): the image built from the Dockerfile, PostgreSQL on the node's host side
through the documented Secret, an HTTP ledger, and the release itself. The pieces are
tests/node/chart.py's.

The image archive comes from $CRONWELL_IMAGE_ARCHIVE, else from `hack/build-image.sh`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cronwell.testing.node import Node
from tests.helpers.kube import Helm
from tests.node import chart
from tests.node.chart import Ledger
from tests.node.chart import component as _component
from tests.node.chart import pods as _pods
from tests.node.chart import ready as _ready

RELEASE = "cw"
__all__ = ["RELEASE", "Ledger", "_component", "_pods", "_ready"]


@pytest.fixture(scope="session")
def cronwell_image(node: Node) -> str:
    """The cronwell image ($CRONWELL_IMAGE_ARCHIVE, else built), imported into the node."""
    archive = os.environ.get("CRONWELL_IMAGE_ARCHIVE") or chart.build_image()
    return chart.import_image(node, archive)


@pytest.fixture(scope="session")
def database(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The shared release's PostgreSQL (see chart.start_database)."""
    yield from chart.start_database(node, tmp_path_factory.mktemp("pg-node"))


@pytest.fixture(scope="session")
def ledger(node: Node) -> Iterator[tuple[str, Ledger]]:
    """The ledger's base URL (reachable from the pods) and what it recorded."""
    server, recorded = chart.serve_ledger(node.host_ip)
    try:
        yield f"http://{node.host_ip}:{server.server_address[1]}", recorded
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def release(
    node: Node,
    cronwell_image: str,
    database: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    ns = f"cronwell-{uuid.uuid4().hex[:6]}"
    # A namespace of its own for job targets, as users list theirs in jobTarget.namespaces
    # (the chart's Roles go into it, so it exists before the install).
    jobs_ns = f"{ns}-jobs"
    node.kubectl("create", "namespace", jobs_ns)
    helm = Helm(node, tmp_path_factory.mktemp("helm"))
    ready = chart.helm_install(
        node, helm, RELEASE, ns, cronwell_image, database["url"],
        "--set", f"jobTarget.namespaces={{{jobs_ns}}}",
        # The dashboard with actions (tests/node/test_ui.py).
        "--set", "ui.enabled=true", "--set", "ui.allowActions=true",
    )  # fmt: skip
    state = {"ns": ns, "jobs_ns": jobs_ns, "helm": helm, "install_seconds": ready}
    try:
        yield state
    finally:
        # No --wait: the node's teardown kills whatever is still terminating.
        helm("uninstall", RELEASE, "--namespace", ns, check=False)
        node.kubectl("delete", "namespace", ns, jobs_ns, "--wait=false", check=False)
