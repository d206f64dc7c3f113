"""The operator as a real process against a real API server and a real PostgreSQL:
ScheduledJob YAML applied, edited, suspended, triggered and deleted with kubectl ends up in
the store (job id = CR uid), and the store's view comes back as status and printer columns.

One operator serves one namespace for the whole module (its own database and Lease), so
the tests here share it and use distinct job names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cronwell.testing.controlplane import Cluster
from cronwell_operator.testing import OperatorProcess, sql
from tests.helpers.kube import FAST_STATUS_ARGS, running_operator
from tests.helpers.wait import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crd(kube: Cluster) -> None:
    kube.install_crds([ROOT / "crds"])


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, crd: None, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kube, ns, store, log, *FAST_STATUS_ARGS, identity="op-main") as op:
        yield op
        # Let the operator run the finalizers before it goes (else the namespace never empties).
        kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s", check=False)


def sj(name: str, spec: str, annotations: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {json.dumps(meta)}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )


def apply(kube: Cluster, ns: str, manifest: str) -> str:
    return kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest).stdout.strip()


def get(kube: Cluster, ns: str, name: str, *args: str) -> Any:
    return json.loads(kube.kubectl("get", "sj", name, "-n", ns, "-o", "json", *args).stdout)


def job(store: str, uid: str) -> dict[str, Any] | None:
    rows = sql(store, "SELECT * FROM cronwell_jobs WHERE id = %s", (uid,))
    return rows[0] if rows else None


def condition(obj: Any, type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def test_apply_creates_the_job_under_the_cr_uid(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    apply(kube, ns, sj("create", 'schedule: "*/10 * * * *"\ntarget: {log: {}}'))
    uid = get(kube, ns, "create")["metadata"]["uid"]
    row = eventually(operator, lambda: job(store, uid), "the job row")
    assert (row["namespace"], row["name"], row["generation"]) == (ns, "create", 1)
    assert row["spec"]["schedule"] == "*/10 * * * *" and not row["suspended"]

    obj = eventually(
        operator,
        lambda: (o := get(kube, ns, "create")).get("status", {}).get("observedGeneration") and o,
        "status.observedGeneration",
    )
    assert obj["metadata"]["finalizers"] == ["cronwell.dev/finalizer"]
    assert condition(obj, "Ready")["status"] == "True"
    assert condition(obj, "Suspended")["status"] == "False"
    assert obj["status"]["nextScheduleTime"].endswith(":00Z")
    line = kube.kubectl("get", "sj", "create", "-n", ns, "--no-headers").stdout.split()
    assert line[1:6] == ["*/10", "*", "*", "*", "*"] and line[8] == "0"  # SCHEDULE, ACTIVE
    assert line[9] == obj["status"]["nextScheduleTime"]  # NEXT RUN (LAST * are empty)


def test_edit_updates_the_same_job(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    apply(kube, ns, sj("edit", 'schedule: "0 3 * * *"\ntarget: {log: {}}'))
    uid = get(kube, ns, "edit")["metadata"]["uid"]
    eventually(operator, lambda: job(store, uid), "the job row")
    apply(kube, ns, sj("edit", 'schedule: "0 4 * * *"\ntimeZone: Asia/Tokyo\ntarget: {log: {}}'))
    row = eventually(
        operator,
        lambda: (r := job(store, uid)) and r["generation"] == 2 and r,
        "generation 2 in the store",
    )
    assert row["spec"]["schedule"] == "0 4 * * *" and row["spec"]["timeZone"] == "Asia/Tokyo"
    assert sql(store, "SELECT count(*) AS n FROM cronwell_jobs WHERE name = 'edit'")[0]["n"] == 1
    obj = eventually(
        operator,
        lambda: (o := get(kube, ns, "edit"))["status"].get("observedGeneration") == 2 and o,
        "observedGeneration 2",
    )
    # 04:00 in Tokyo is 19:00 UTC.
    assert obj["status"]["nextScheduleTime"].endswith("T19:00:00Z")


@pytest.mark.parametrize("mode", ["client-side", "server-side"])
def test_reapplying_the_same_yaml_changes_nothing(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess, mode: str
) -> None:
    """Invariant 7: after the operator settles, re-applying the same YAML (kubectl, or
    server-side apply as Argo CD / Flux do) writes nothing: same generation, same
    resourceVersion, same store row, no handler run."""
    name = f"noop-{mode}"
    manifest = sj(name, 'schedule: "0 0 1 1 *"\ntarget: {http: {url: "https://x.example"}}')
    if mode == "client-side":
        argv = ["apply", "-n", ns, "-f", "-"]
        manager = "kubectl-client-side-apply"
    else:
        argv = ["apply", "--server-side", "--field-manager=gitops", "-n", ns, "-f", "-"]
        manager = "gitops"
    kube.kubectl(*argv, input=manifest)
    uid = get(kube, ns, name)["metadata"]["uid"]
    settled = eventually(
        operator,
        lambda: (
            (o := get(kube, ns, name)).get("status", {}).get("observedGeneration")
            and "kopf" in o["status"]
            and o
        ),
        "the first status",
    )
    row_before = job(store, uid)
    handled = operator.output().count("action=job_")  # job_created / job_updated so far
    out = kube.kubectl(*argv, input=manifest).stdout.strip()
    assert out.endswith("unchanged" if mode == "client-side" else "serverside-applied"), out
    # Anything the operator would do shows up within a reconcile and a writer pass: make a
    # later change elsewhere and wait until both are through.
    probe = f"probe-{mode}"
    apply(kube, ns, sj(probe, 'schedule: "@yearly"\ntarget: {log: {}}'))
    probe_uid = get(kube, ns, probe)["metadata"]["uid"]
    eventually(operator, lambda: job(store, probe_uid), "the probe job (a later reconcile)")
    eventually(
        operator,
        lambda: get(kube, ns, probe).get("status", {}).get("observedGeneration"),
        "the probe's status (a later writer pass)",
    )
    after = get(kube, ns, name, "--show-managed-fields")
    after["metadata"].pop("managedFields")
    assert after == settled
    after = get(kube, ns, name, "--show-managed-fields")
    assert after["metadata"]["generation"] == settled["metadata"]["generation"] == 1
    assert after["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"], (
        json.dumps(settled, indent=1),
        json.dumps(after, indent=1),
    )
    assert after["spec"] == settled["spec"] and after["status"] == settled["status"]
    assert job(store, uid) == row_before
    assert operator.output().count("action=job_") == handled + 1  # only the probe's
    # The operator owns no field of spec, labels or annotations: only its finalizer
    # (through kopf's patch) and status (through the status subresource).
    for entry in after["metadata"]["managedFields"]:
        if entry["manager"] == manager:
            continue
        fields = json.dumps(entry.get("fieldsV1", {}))
        assert '"f:spec"' not in fields and '"f:labels"' not in fields, entry
        assert '"f:annotations"' not in fields, entry
    assert not after["metadata"].get("labels")
    assert set(after["metadata"].get("annotations") or {}) <= {
        "kubectl.kubernetes.io/last-applied-configuration"
    }


def test_suspend_and_resume_from_spec(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    apply(kube, ns, sj("pause", 'schedule: "*/5 * * * *"\nsuspend: true\ntarget: {log: {}}'))
    uid = get(kube, ns, "pause")["metadata"]["uid"]
    assert eventually(operator, lambda: job(store, uid), "the job row")["suspended"] is True
    obj = eventually(
        operator,
        lambda: condition(o := get(kube, ns, "pause"), "Suspended").get("status") == "True" and o,
        "Suspended=True",
    )
    assert "nextScheduleTime" not in obj["status"]  # nothing is scheduled
    assert kube.kubectl("get", "sj", "pause", "-n", ns, "--no-headers").stdout.split()[7] == "true"

    kube.kubectl(
        "patch", "sj", "pause", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    eventually(operator, lambda: job(store, uid)["suspended"] is False, "resumed in the store")
    obj = eventually(
        operator,
        lambda: condition(o := get(kube, ns, "pause"), "Suspended").get("status") == "False" and o,
        "Suspended=False",
    )
    assert obj["status"]["nextScheduleTime"]


def _triggers(store: str, uid: str) -> list[str]:
    rows = sql(
        store,
        "SELECT idempotency_key FROM cronwell_occurrences WHERE job_id = %s AND origin = "
        "'trigger' ORDER BY id",
        (uid,),
    )
    return [str(r["idempotency_key"]) for r in rows]


def test_trigger_annotation_runs_once_per_value(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    apply(kube, ns, sj("kick", 'schedule: "@yearly"\nsuspend: true\ntarget: {log: {}}'))
    uid = get(kube, ns, "kick")["metadata"]["uid"]
    eventually(operator, lambda: job(store, uid), "the job row")
    kube.kubectl("annotate", "sj", "kick", "-n", ns, "cronwell.dev/trigger=run-1")
    keys = eventually(operator, lambda: _triggers(store, uid), "the triggered occurrence")
    assert len(keys) == 1 and keys[0].endswith("run-1")
    # Another change (a label) with the same trigger value: no second run.
    kube.kubectl("label", "sj", "kick", "-n", ns, "team=ops")
    kube.kubectl("annotate", "sj", "kick", "-n", ns, "cronwell.dev/trigger=run-2", "--overwrite")
    keys = eventually(operator, lambda: len(k := _triggers(store, uid)) >= 2 and k, "run-2")
    kube.kubectl("annotate", "sj", "kick", "-n", ns, "cronwell.dev/trigger=run-2", "--overwrite")
    apply(kube, ns, sj("kick", 'schedule: "@yearly"\nsuspend: true\ntarget: {log: {}}',
                       {"cronwell.dev/trigger": "run-2"}))  # fmt: skip
    eventually(
        operator,
        lambda: job(store, uid)["spec"]["suspend"] is True,
        "still the same job",
    )
    assert [k.rsplit(":", 1)[-1] for k in _triggers(store, uid)] == ["run-1", "run-2"]


def test_delete_tombstones_the_job_and_releases_the_cr(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    apply(kube, ns, sj("gone", 'schedule: "* * * * *"\ntarget: {log: {}}'))
    uid = get(kube, ns, "gone")["metadata"]["uid"]
    eventually(operator, lambda: job(store, uid), "the job row")
    kube.kubectl("delete", "sj", "gone", "-n", ns, "--timeout=60s")
    assert kube.kubectl("get", "sj", "gone", "-n", ns, check=False).returncode != 0
    row = job(store, uid)
    assert row is not None and row["deleted_at"] is not None and row["next_run_at"] is None
    # A new CR of the same name is a new job (new uid), as in Kubernetes.
    apply(kube, ns, sj("gone", 'schedule: "* * * * *"\ntarget: {log: {}}'))
    uid2 = get(kube, ns, "gone")["metadata"]["uid"]
    assert uid2 != uid
    assert eventually(operator, lambda: job(store, uid2), "the new job")["deleted_at"] is None


def test_a_spec_the_store_refuses_is_reported_not_retried(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    """Without the webhook, a spec that passes the schema but not cronwell's validators
    (unknown zone, cron out of range) is reported in status and as a Warning Event."""
    apply(kube, ns, sj("wrong", 'schedule: "61 * * * *"\ntimeZone: Mars/Olympus\n'
                       "target: {log: {}}"))  # fmt: skip
    uid = get(kube, ns, "wrong")["metadata"]["uid"]
    ready = eventually(
        operator,
        lambda: (
            condition(get(kube, ns, "wrong"), "Ready").get("reason") == "InvalidSpec"
            and condition(get(kube, ns, "wrong"), "Ready")
        ),
        "Ready=False InvalidSpec",
    )
    assert ready["status"] == "False"
    assert "spec.schedule: cron '61 * * * *' does not parse" in ready["message"]
    assert "spec.timeZone: unknown time zone 'Mars/Olympus'" in ready["message"]
    assert job(store, uid) is None
    events = eventually(
        operator,
        lambda: kube.kubectl(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=wrong",
            "-o", "json",
        ).stdout.count("Mars/Olympus"),
        "a Warning Event naming the field",
    )  # fmt: skip
    assert events >= 1
    # One Warning with CronJob's reason, posted by the transition, not by each edit; kopf's
    # log bridge ("Error Logging: Handler ... failed permanently") is not the channel.
    for i in ("first-edit", "second-edit"):  # metadata-only edits
        kube.kubectl("label", "sj", "wrong", "-n", ns, f"edit={i}", "--overwrite")
    eventually(  # kopf records the last configuration it handled in status.kopf
        operator,
        lambda: "second-edit" in str((get(kube, ns, "wrong").get("status") or {}).get("kopf")),
        "the operator to handle both edits",
    )
    items = json.loads(
        kube.kubectl(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=wrong",
            "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    warnings = [(e["type"], e["reason"]) for e in items]
    assert warnings.count(("Warning", "UnknownTimeZone")) == 1, warnings
    assert sum(e.get("count") or 1 for e in items if e["reason"] == "UnknownTimeZone") == 1
    assert not [w for w in warnings if w[1] == "Logging" or w[0] == "Error"], warnings
    # Fixing the spec clears it.
    apply(kube, ns, sj("wrong", 'schedule: "1 * * * *"\ntimeZone: UTC\ntarget: {log: {}}'))
    eventually(operator, lambda: job(store, uid), "the job row after the fix")
    eventually(
        operator,
        lambda: condition(get(kube, ns, "wrong"), "Ready").get("status") == "True",
        "Ready=True after the fix",
    )
