"""Issue 19 item 7: upgrade and rollback on the real node while a per-second job runs.

`helm install` with image tag A; a `* * * * * *` ScheduledJob calls the ledger; the image is
retagged B (same sources: what matters is that Kubernetes sees a new image reference and
rolls every pod) and `helm upgrade --reuse-values --set image.tag=B --wait`; the pre-upgrade
migration hook runs once; `helm rollback` to revision 1 puts every pod back on A (the chart
has no pre-rollback hook: the schema is never migrated down); `helm uninstall` keeps the
CRDs (crds.keep), the ScheduledJobs and the store. Over the whole window every instant has
exactly one accepted effect in the ledger: the schedulers roll with maxSurge 1 /
maxUnavailable 0, so one always holds the partitions, and the workers likewise.
Figures (roll times, ledger counts, redeliveries, lateness) are printed, not asserted.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from cronwell.testing.node import Node
from tests.helpers.kube import Helm
from tests.node import chart

RELEASE = "cwup"
# Tags of this test alone: a retag of the same sources, never the shared default tag.
TAG_A, TAG_B = "upgrade-a", "upgrade-b"
COMPONENTS = ("operator", "scheduler", "worker")
JOB = "tick"
PATH = "/tick"
pytestmark = pytest.mark.timeout(3600)


def _rolled(node: Node, ns: str, image: str) -> dict[str, list[str]]:
    """Pods of each component that are not on ``image``, not Ready, or terminating: empty
    lists once the rollout to ``image`` is complete."""
    behind: dict[str, list[str]] = {c: [] for c in COMPONENTS}
    for pod in chart.pods(node, ns):
        c = chart.component(pod)
        if c not in behind:
            continue
        images = {k["image"] for k in pod["spec"]["containers"]}
        if images != {image} or not chart.ready(pod) or pod["metadata"].get("deletionTimestamp"):
            behind[c].append(f"{pod['metadata']['name']} {sorted(images)}")
    return behind


def _wait_rolled(node: Node, ns: str, image: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    behind = _rolled(node, ns, image)
    while any(behind.values()):
        if time.monotonic() > deadline:
            chart.dump(node, ns)
            raise AssertionError(f"pods not all Ready on {image}: {behind}")
        time.sleep(2)
        behind = _rolled(node, ns, image)


def _hook_runs(node: Node, ns: str) -> dict[str, int]:
    """Pods created per migration hook Job (by Job uid), from the Job controller's events:
    helm deletes the Job and its pod once it succeeded, the events outlive them."""
    events = json.loads(
        node.kubectl(
            "-n", ns, "get", "events", "-o", "json",
            "--field-selector", "involvedObject.kind=Job,reason=SuccessfulCreate",
        ).stdout
    )["items"]  # fmt: skip
    runs: Counter[str] = Counter()
    for event in events:
        obj = event["involvedObject"]
        if obj["name"].endswith("-migrate"):
            runs[obj["uid"]] += int(event.get("count") or 1)
    return dict(runs)


class Watch:
    """Samples Ready schedulers and workers every ~2 s during a roll: the fewest seen."""

    def __init__(self, node: Node, ns: str) -> None:
        self.node, self.ns = node, ns
        self.fewest: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2):
            try:
                pods = chart.pods(self.node, self.ns)
            except Exception:  # a failed sample is not a finding
                continue
            self.samples += 1
            for c in ("scheduler", "worker"):
                n = sum(
                    1
                    for p in pods
                    if chart.component(p) == c
                    and chart.ready(p)
                    and not p["metadata"].get("deletionTimestamp")
                )
                self.fewest[c] = min(self.fewest.get(c, n), n)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def own_database(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A store of this release alone (the shared release must not run its jobs)."""
    yield from chart.start_database(node, tmp_path_factory.mktemp("pg-upgrade"))


@pytest.fixture(scope="module")
def own_ledger(node: Node) -> Iterator[tuple[str, chart.Ledger]]:
    server, recorded = chart.serve_ledger(node.host_ip)
    try:
        yield f"http://{node.host_ip}:{server.server_address[1]}", recorded
    finally:
        server.shutdown()
        server.server_close()


def test_upgrade_rollback_uninstall_nothing_lost(
    node: Node,
    own_database: dict[str, str],
    own_ledger: tuple[str, chart.Ledger],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    database = own_database
    base, recorded = own_ledger
    image_a = chart.import_image(node, chart.build_image(TAG_A))
    archive_b = chart.build_image(TAG_B)
    ns = f"cronwell-up-{uuid.uuid4().hex[:6]}"
    helm = Helm(node, tmp_path_factory.mktemp("helm-upgrade"))
    chart.helm_install(node, helm, RELEASE, ns, image_a, database["url"])
    crds = ("scheduledjobs.cronwell.dev", "workerpools.cronwell.dev")
    try:
        _wait_rolled(node, ns, image_a)
        hooks_installed = _hook_runs(node, ns)
        assert len(hooks_installed) == 1, hooks_installed
        job = chart.per_second_job(ns, JOB, f"{base}{PATH}")
        node.kubectl("apply", "-f", "-", input=json.dumps(job))
        uid = node.kubectl("-n", ns, "get", "sj", JOB, "-o", "jsonpath={.metadata.uid}").stdout
        deadline = time.monotonic() + 300
        while not recorded.accepted(PATH):
            assert time.monotonic() < deadline, "no first effect within 300 s"
            time.sleep(0.5)

        # A new image reference while the job runs.
        image_b = chart.import_image(node, archive_b)
        assert image_b.rsplit(":", 1)[1] == TAG_B, image_b
        time.sleep(5)
        figures: dict[str, float] = {}
        fewest: dict[str, dict[str, int]] = {}
        began = {"upgrade": time.time()}
        started = time.monotonic()
        with Watch(node, ns) as watch:
            helm(
                "upgrade", RELEASE, str(chart.CHART), "--namespace", ns, "--reuse-values",
                "--set", f"image.tag={TAG_B}", "--wait", "--timeout", "10m",
                timeout=660,
            )  # fmt: skip
            figures["upgrade --wait"] = time.monotonic() - started
            _wait_rolled(node, ns, image_b)
            figures["upgrade: every pod Ready on B, old ones gone"] = time.monotonic() - started
        fewest["upgrade"] = watch.fewest
        hooks_upgraded = _hook_runs(node, ns)
        new_hooks = {u: n for u, n in hooks_upgraded.items() if u not in hooks_installed}
        # The pre-upgrade hook ran once: one Job, one pod (no retry).
        assert list(new_hooks.values()) == [1], hooks_upgraded

        time.sleep(10)
        began["rollback"] = time.time()
        started = time.monotonic()
        with Watch(node, ns) as watch:
            helm(
                "rollback", RELEASE, "1", "--namespace", ns, "--wait", "--timeout", "10m",
                timeout=660,
            )  # fmt: skip
            figures["rollback --wait"] = time.monotonic() - started
            _wait_rolled(node, ns, image_a)
            figures["rollback: every pod Ready on A, old ones gone"] = time.monotonic() - started
        fewest["rollback"] = watch.fewest
        # No pre-rollback hook: the schema is never migrated down.
        assert _hook_runs(node, ns) == hooks_upgraded
        time.sleep(10)

        # Stop the window; let the last occurrences' retries land.
        suspended_at = time.time()
        node.kubectl(
            "-n", ns, "patch", "sj", JOB, "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        time.sleep(15)
        with psycopg.connect(database["local"]) as conn:
            rows = conn.execute(
                "SELECT o.idempotency_key, o.state, o.reason,"
                " (SELECT count(*) FROM cronwell_attempts a"
                "   WHERE a.occurrence_id = o.id AND a.outcome = 'succeeded')"
                " FROM cronwell_occurrences o WHERE o.job_id = %s ORDER BY o.scheduled_for",
                (uid,),
            ).fetchall()
            attempts_before = conn.execute("SELECT count(*) FROM cronwell_attempts").fetchone()
        accepted = recorded.accepted(PATH)
        requests = [r for r in recorded.requests if r["path"] == PATH]
        state = {key: (st, reason, wins) for key, st, reason, wins in rows}
        first = min(chart.instant(k) for k in accepted)
        # Instants due more than 10 s before the suspension must have landed (the job's
        # timeout); later ones may still be pending when it was suspended.
        expected = [first + i for i in range(int(suspended_at - 10 - first) + 1)]
        landed = {chart.instant(k) for k in accepted}
        # Each missing instant: its offset from the upgrade's and the rollback's start, and
        # what the store says of it.
        missing = [
            (
                _key_time(t),
                {k: round(t - at, 1) for k, at in began.items()},
                state.get(f"{uid}:{_key_time(t)}"),
            )
            for t in expected
            if t not in landed
        ]
        redelivered = Counter(r["key"] for r in requests)
        late = [r["at"] - chart.instant(k) for k, r in accepted.items()]
        print(
            f"\nupgrade: {len(expected)} expected instants, {len(accepted)} accepted effects, "
            f"{len(missing)} missing, {len(requests) - len(accepted)} redeliveries over "
            f"{sum(1 for n in redelivered.values() if n > 1)} keys, "
            f"max lateness {max(late):.1f}s, store: {len(rows)} occurrences, "
            f"{Counter(s for s, _, _ in state.values())}"
        )
        for t, offsets, st in missing:
            print(f"  missing {t} ({offsets} s after the start of each): {st}")
        for name, seconds in figures.items():
            print(f"  {name}: {seconds:.1f}s")
        print(f"  fewest Ready pods seen while rolling: {fewest}")
        print(f"  migration hook Jobs (uid: pods): {hooks_upgraded}")
        # One job object over the whole window, one key per instant.
        assert all(k.startswith(f"{uid}:") for k in accepted), set(accepted)
        assert not missing, missing
        # The store agrees: each instant succeeded once, and only once (its unique index).
        for t in expected:
            st, reason, wins = state[f"{uid}:{_key_time(t)}"]
            assert (st, wins) == ("succeeded", 1), (t, st, reason, wins)
        assert set(accepted) <= set(state)

        helm("uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "5m", timeout=330)
        for crd in crds:
            assert node.kubectl("get", "crd", crd, check=False).returncode == 0, crd
        kept = node.kubectl("-n", ns, "get", "sj", JOB, "-o", "jsonpath={.metadata.uid}").stdout
        assert kept == uid
        # The Deployments are gone; their pods terminate gracefully (not awaited by helm).
        deadline = time.monotonic() + 300
        while left := [p for p in chart.pods(node, ns) if chart.component(p) in COMPONENTS]:
            assert time.monotonic() < deadline, [p["metadata"]["name"] for p in left]
            time.sleep(2)
        with psycopg.connect(database["local"]) as conn:
            jobs = conn.execute("SELECT count(*) FROM cronwell_jobs WHERE id = %s", (uid,))
            assert jobs.fetchone() == (1,)
            occurrences = conn.execute(
                "SELECT count(*) FROM cronwell_occurrences WHERE job_id = %s", (uid,)
            ).fetchone()
            attempts = conn.execute("SELECT count(*) FROM cronwell_attempts").fetchone()
        assert occurrences and occurrences[0] >= len(rows)
        assert attempts_before and attempts and attempts[0] >= attempts_before[0] > 0
    finally:
        helm("uninstall", RELEASE, "--namespace", ns, check=False)
        # The operator is gone: nothing would remove the ScheduledJobs' finalizers.
        for name in node.kubectl("-n", ns, "get", "sj", "-o", "name", check=False).stdout.split():
            node.kubectl(
                "-n", ns, "patch", name, "--type=merge", "-p",
                '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
        node.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _key_time(t: float) -> str:
    """The instant part of an idempotency key (the inverse of chart.instant)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
