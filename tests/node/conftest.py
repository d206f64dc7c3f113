"""Node fixtures: one real node (kubelet + containerd in a network namespace) per session.

Every test under tests/node is marked ``node``. The node's binaries come from
``bash hack/envtest.sh --node`` (``make test`` and ``make e2e-node`` build them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronwell.testing.controlplane import ControlPlaneError, find_assets
from cronwell.testing.node import NODE_BINARIES, NODE_HINT, Node
from cronwell.testing.oci import write_archive
from tests.node.release import cronwell_image, database, ledger, release

__all__ = ["cronwell_image", "database", "ledger", "release"]  # one install per session

NODE_DIR = Path(__file__).resolve().parent
BUSYBOX = Path("/bin/busybox")
TEST_IMAGE = "localhost/cronwell/busybox:test"
#: An image on a closed port of the node's own loopback: pulling it is a safe, deliberate
#: pull attempt (the harness must notice it), and nothing leaves the namespace.
CANARY_REGISTRY = "127.0.0.1:1/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if NODE_DIR in item.path.resolve().parents:
            item.add_marker(pytest.mark.node)
    # The upgrade test installs, upgrades and uninstalls a release of its own: it runs
    # before the shared release is installed, since two releases whose operators both watch
    # every namespace would both run its job. The CloudNativePG test runs first, on a node
    # of its own that is gone before the shared node starts (never two nodes at once).
    slots = [i for i, item in enumerate(items) if NODE_DIR in item.path.resolve().parents]
    first = {"test_cnpg.py": 0, "test_upgrade.py": 1}
    ordered = sorted((items[i] for i in slots), key=lambda it: first.get(it.path.name, 2))
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A Ready node with the test image imported; fails if any image pull was attempted."""
    try:
        assets = find_assets(NODE_BINARIES)
    except ControlPlaneError as exc:
        pytest.fail(f"node tests need the node's binaries: {exc}\n({NODE_HINT})", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("node tests need root (network namespaces, mounts, cgroups)", pytrace=False)
    if not BUSYBOX.is_file():
        pytest.fail(f"{BUSYBOX} is missing: run `make sysdeps` (busybox-static)", pytrace=False)
    archive = tmp_path_factory.mktemp("images") / "busybox.tar"
    write_archive(
        archive,
        TEST_IMAGE,
        {"bin/": (b"", 0o755), "bin/busybox": (BUSYBOX.read_bytes(), 0o755)},
        {},
    )
    with Node(assets, images=[archive]) as running:
        print(f"\nnode: Ready in {running.start_seconds:.1f}s")
        yield running
        running.assert_no_pulls(allowed=CANARY_REGISTRY)
