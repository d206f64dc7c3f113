"""The validating admission webhook (kopf's, HTTPS with a self-signed certificate), called by
the real API server: what the CRD schema and CEL cannot check is refused at `kubectl apply`
with a message naming the field and the fix — the spec's own rules, the pool (WorkerPools
and static pools) and the namespace's schedule rate (counted from the store)."""

from __future__ import annotations

import json
import re
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronwell.kubejson import api_client
from cronwell.testing.controlplane import Cluster, KubectlError, free_port
from cronwell_operator.kube import Kube
from cronwell_operator.testing import (
    FAST_LEASE_ARGS,
    OperatorProcess,
    sql,
    wait_until,
)
from tests.helpers.kube import fresh_namespace

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "validate-scheduledjob.cronwell.dev"
DENIED = f'admission webhook "{WEBHOOK}" denied the request: '


RATE_CAP = 3000  # the operator's default cap in this module (runs per hour)
RATE_ANNOTATION = "cronwell.dev/max-occurrences-per-hour"


@pytest.fixture(scope="module")
def rate_ns(kube: Cluster, kube_api: Any) -> Iterator[str]:
    """A second served namespace, for the schedule-rate rules (its jobs alone count)."""
    yield from fresh_namespace(kube, kube_api, "whrate")


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, ns: str, rate_ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    tmp = tmp_path_factory.mktemp("webhook")
    args = ["-n", ns, "-n", rate_ns, "--lease-name", f"op-{ns}", *FAST_LEASE_ARGS]
    args += ["--webhook-port", str(free_port()), "--webhook-addr", "127.0.0.1"]
    args += ["--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(tmp / "certs")]
    args += ["--pool", "default", "--pool", "batch", "--pool-namespaces", f"batch={ns}"]
    args += ["--webhook-max-occurrences-per-hour", str(RATE_CAP)]
    # Job targets may run in `ns` only (the chart's jobTarget.namespaces).
    env = {"CRONWELL_OPERATOR_WEBHOOK_JOB_NAMESPACES": json.dumps([ns])}
    op = OperatorProcess(kube.kubeconfig, store, tmp / "operator.log", args=args, env=env)
    try:
        op.start().wait_ready(120)
        # kopf creates/patches the ValidatingWebhookConfiguration once its server listens.
        wait_until(lambda: _webhooks(kube), 60, "the webhook configuration", check=op._alive)
        wait_until(lambda: _accepts(kube, ns), 60, "the webhook answering", check=op._alive)
        yield op
        for namespace in (ns, rate_ns):
            kube.kubectl("delete", "sj", "--all", "-n", namespace, "--timeout=60s", check=False)
    finally:
        op.stop()
        # Never leave a Fail-policy webhook behind for the other tests of the session.
        kube.kubectl("delete", "validatingwebhookconfiguration", "cronwell.dev", check=False)


def _webhooks(kube: Cluster) -> list[dict[str, Any]]:
    out = kube.kubectl("get", "validatingwebhookconfiguration", "cronwell.dev", "-o", "json",
                       check=False)  # fmt: skip
    if out.returncode != 0:
        return []
    return list(json.loads(out.stdout).get("webhooks") or [])


def _accepts(kube: Cluster, ns: str) -> bool:
    probe = sj("probe", 'schedule: "@yearly"\ntarget: {log: {}}')
    out = kube.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=probe, check=False)
    return out.returncode == 0


def sj(name: str, spec: str) -> str:
    return (
        f"apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {{name: {name}}}\n"
        "spec:\n" + "".join(f"  {line}\n" for line in spec.strip().splitlines())
    )


def refused(kube: Cluster, ns: str, manifest: str) -> str:
    with pytest.raises(KubectlError) as exc:
        kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    return str(exc.value.stderr)


def applied(kube: Cluster, ns: str, manifest: str) -> str:
    """Apply, which must pass; its stderr (where kubectl prints admission warnings)."""
    return str(kube.kubectl("apply", "-n", ns, "-f", "-", input=manifest).stderr)


def in_store(store: str, op: OperatorProcess, ns: str, name: str, schedule: str) -> None:
    """Wait until the job is reconciled with this schedule (the rate cap counts the store)."""
    wait_until(
        lambda: sql(
            store,
            "SELECT 1 FROM cronwell_jobs WHERE namespace = %s AND name = %s "
            "AND deleted_at IS NULL AND spec->>'schedule' = %s",
            (ns, name, schedule),
        ),
        60,
        f"{ns}/{name} in the store with {schedule!r}",
        check=op._alive,
    )


def workerpool(kube: Cluster, ns: str, name: str) -> None:
    kube.apply(
        f"apiVersion: cronwell.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: {name}, "
        f"namespace: {ns}}}\nspec: {{scaleTargetRef: {{name: worker-{name}}}}}\n"
    )


def test_configuration_is_managed_by_the_operator(kube: Cluster, operator: OperatorProcess) -> None:
    (hook,) = _webhooks(kube)
    assert hook["name"] == WEBHOOK
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
    assert hook["clientConfig"]["caBundle"]  # the self-signed certificate
    (rule,) = hook["rules"]
    assert rule["resources"] == ["scheduledjobs"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            'schedule: "61 * * * *"\ntarget: {log: {}}',
            "ScheduledJob bad: spec.schedule: cron '61 * * * *' does not parse: "
            "minute value 61 is out of range 0-59 (use 5 fields (minute hour "
            "day-of-month month day-of-week), 6 with seconds first, or a macro such as "
            "@hourly; e.g. '*/5 * * * *')",
            id="cron",
        ),
        pytest.param(
            'schedule: "0 0 1 * SUN#2"\ntarget: {log: {}}',
            "ScheduledJob bad: spec.schedule: cron '0 0 1 * SUN#2' never fires: the 1st is "
            "never the 2nd Sunday (with #, L or W, day-of-month and day-of-week must both "
            "match): set one of the two day fields to ?",
            id="never-fires",
        ),
        pytest.param(
            'schedule: "@daily"\ntimeZone: Europe/Pariss\ntarget: {log: {}}',
            "ScheduledJob bad: spec.timeZone: unknown time zone 'Europe/Pariss': use an IANA "
            "name such as 'Europe/Paris' or 'UTC'",
            id="zone",
        ),
        pytest.param(
            'schedule: "@daily"\ntarget: {handler: {name: h, payload: {blob: "'
            + "x" * 70_000
            + '"}}}',
            "ScheduledJob bad: spec.target.handler.payload: 70011 bytes is over the 65536-byte "
            "limit: keep large data elsewhere (a ConfigMap, object storage) and pass a "
            "reference to it",
            id="payload",
        ),
    ],
)
def test_bad_specs_are_refused_naming_the_field_and_the_fix(
    kube: Cluster, ns: str, operator: OperatorProcess, spec: str, message: str
) -> None:
    stderr = refused(kube, ns, sj("bad", spec))
    assert DENIED + message in stderr, stderr
    assert kube.kubectl("get", "sj", "bad", "-n", ns, check=False).returncode != 0


def test_schema_and_cel_answer_before_the_webhook(
    kube: Cluster, ns: str, operator: OperatorProcess
) -> None:
    stderr = refused(kube, ns, sj("both", 'schedule: "61 * * * *"\nrunAt: "2030-01-01T00:00:00Z"'
                                  "\ntarget: {log: {}}"))  # fmt: skip
    assert "set exactly one of spec.schedule (cron) or spec.runAt (one-shot)" in stderr
    assert WEBHOOK not in stderr


def test_good_specs_and_edits_pass_and_are_reconciled(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    good = (
        'schedule: "@hourly"\ntimeZone: Europe/Paris\ntarget: {handler: {name: h, payload: {a: 1}}}'
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("good", good))
    uid = json.loads(kube.kubectl("get", "sj", "good", "-n", ns, "-o", "json").stdout)["metadata"][
        "uid"
    ]
    wait_until(
        lambda: sql(store, "SELECT 1 FROM cronwell_jobs WHERE id = %s", (uid,)),
        60,
        "reconciled",
        check=operator._alive,
    )
    # A bad edit is refused and leaves the object as it was.
    stderr = refused(kube, ns, sj("good", 'schedule: "* * * *"\ntarget: {log: {}}'))
    assert DENIED in stderr and "spec.schedule:" in stderr
    obj = json.loads(kube.kubectl("get", "sj", "good", "-n", ns, "-o", "json").stdout)
    assert obj["spec"]["schedule"] == "@hourly" and obj["metadata"]["generation"] == 1
    # Metadata-only changes and deletion are never blocked.
    kube.kubectl("annotate", "sj", "good", "-n", ns, "cronwell.dev/trigger=now")
    kube.kubectl("delete", "sj", "good", "-n", ns, "--timeout=60s")


def job_target(spec: str) -> str:
    """A job target whose Job's spec holds `spec` (YAML flow mapping entries) too."""
    return (
        'schedule: "@hourly"\ntarget: {job: {jobTemplate: {spec: {' + spec + "template: {spec: "
        "{restartPolicy: Never, containers: [{name: main, image: report:1}]}}}}}}"
    )


def test_a_job_target_is_checked_by_a_dry_run_of_its_job(
    kube: Cluster, ns: str, rate_ns: str, operator: OperatorProcess
) -> None:
    # A namespace the workers may not create Jobs in: refused, with the fix.
    stderr = refused(kube, rate_ns, sj("report", job_target("")))
    assert (
        DENIED
        + (
            f"ScheduledJob report: spec.target.job: the workers may not create Jobs in namespace "
            f"{rate_ns}: add {rate_ns} to jobTarget.namespaces in the chart's values"
        )
        in stderr
    ), stderr
    # What only the API server knows: a misspelt field, duplicate container names.
    stderr = refused(kube, ns, sj("report", job_target("backOffLimit: 2, ")))
    assert DENIED + "ScheduledJob report: spec.target.job.jobTemplate: the API server " in stderr
    assert 'strict decoding error: unknown field "spec.backOffLimit"' in stderr, stderr
    twice = job_target("").replace(
        "containers: [{name: main, image: report:1}]",
        "containers: [{name: main, image: report:1}, {name: main, image: report:2}]",
    )
    stderr = refused(kube, ns, sj("report", twice))
    assert "spec.target.job.jobTemplate" in stderr and "Duplicate value" in stderr, stderr
    # A good one is admitted; the dry-run stored no Job.
    applied(kube, ns, sj("report", job_target("backoffLimit: 2, ")))
    jobs = json.loads(kube.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout)["items"]
    assert jobs == []
    kube.kubectl("delete", "sj", "report", "-n", ns, "--timeout=60s")


def _review(port: int, certs: Path, namespace: str, manifest: str) -> dict[str, Any]:
    """POST one AdmissionReview (CREATE) straight to a webhook server; its response."""
    obj = yaml.safe_load(manifest)
    obj["metadata"]["namespace"] = namespace
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d3f-test",
            "kind": {"group": "cronwell.dev", "version": "v1alpha1", "kind": "ScheduledJob"},
            "resource": {
                "group": "cronwell.dev", "version": "v1alpha1", "resource": "scheduledjobs",
            },
            "operation": "CREATE",
            "namespace": namespace,
            "name": obj["metadata"]["name"],
            "userInfo": {"username": "test"},
            "object": obj,
            "dryRun": False,
        },
    }  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(certs / "tls.crt"))
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}/validate-scheduledjob",
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())["response"]
    return answer


def test_a_standby_serves_the_webhook_too(
    kube: Cluster, ns: str, rate_ns: str, store: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Admission must not depend on which replica leads: a standby (waiting for the Lease)
    answers AdmissionReviews itself, every rule included (the rate reads the store and the
    Namespace), and leaves the cluster's configuration to the leader."""
    port = free_port()
    certs = tmp_path / "certs"
    args = ["-n", ns, "-n", rate_ns, "--lease-name", f"op-{ns}", *FAST_LEASE_ARGS]
    args += ["--webhook-port", str(port), "--webhook-addr", "127.0.0.1"]
    args += ["--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(certs)]
    args += ["--webhook-max-occurrences-per-hour", str(RATE_CAP)]
    standby = OperatorProcess(
        kube.kubeconfig, store, tmp_path / "standby.log", identity="op-standby", args=args
    )
    with standby:
        standby.wait_for_log("standby: serving the webhook", 60)
        answer = _review(port, certs, ns, sj("direct", 'schedule: "@often"\ntarget: {log: {}}'))
        assert answer["uid"] == "0d3f-test" and answer["allowed"] is False
        assert "spec.schedule:" in answer["status"]["message"]
        answer = _review(
            port, certs, rate_ns, sj("direct", 'schedule: "* * * * * *"\ntarget: {log: {}}')
        )
        assert answer["allowed"] is False, answer
        assert "over its cap of 3,000" in answer["status"]["message"]
        assert "operator ready" not in standby.output()  # it did not take over
        # The configuration still points at the leader.
        (hook,) = _webhooks(kube)
        assert f":{port}/" not in hook["clientConfig"]["url"]


def test_an_unknown_pool_is_refused_until_a_workerpool_names_it(
    kube: Cluster, ns: str, operator: OperatorProcess
) -> None:
    manifest = sj("gpu-job", 'schedule: "@daily"\npool: gpu\ntarget: {log: {}}')
    stderr = refused(kube, ns, manifest)
    # Other modules' WorkerPools may exist in this shared cluster: the known list is a
    # superset of the static pools, and never names 'gpu'.
    match = re.search(
        re.escape(DENIED + "ScheduledJob gpu-job: spec.pool: no worker pool 'gpu' (known pools: ")
        + r"([^)]*)"
        + re.escape(
            "): set spec.pool to a known pool, or create a WorkerPool named 'gpu' "
            "(cronwell.dev/v1alpha1) for the worker Deployment that serves it"
        ),
        stderr,
    )
    assert match, stderr
    known = match.group(1).split(", ")
    assert {"batch", "default"} <= set(known) and "gpu" not in known, known
    # A static pool (--pool) passes; so does a WorkerPool's name, at once (a miss relists).
    applied(kube, ns, sj("batch-job", 'schedule: "@daily"\npool: batch\ntarget: {log: {}}'))
    workerpool(kube, ns, "gpu")
    applied(kube, ns, manifest)
    # An edit that keeps the pool is not checked again, even once the WorkerPool is gone.
    kube.kubectl("delete", "workerpool", "gpu", "-n", ns)
    applied(kube, ns, sj("gpu-job", 'schedule: "@hourly"\npool: gpu\ntarget: {log: {}}'))
    # A new job in it is refused again once the cached names expire (a few seconds).
    other = sj("other", 'schedule: "@daily"\npool: gpu\ntarget: {log: {}}')

    def dry_run_refusal() -> str:
        out = kube.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=other,
                           check=False)  # fmt: skip
        return str(out.stderr) if out.returncode != 0 else ""

    stderr = wait_until(dry_run_refusal, 30, "refused once the WorkerPool is gone")
    assert "spec.pool: no worker pool 'gpu'" in stderr


def test_a_namespace_schedule_rate_is_capped(
    kube: Cluster, rate_ns: str, store: str, operator: OperatorProcess
) -> None:
    ns = rate_ns
    every_second = 'schedule: "* * * * * *"\ntarget: {log: {}}'
    stderr = refused(kube, ns, sj("fast", every_second))
    assert (
        DENIED + f"ScheduledJob fast: spec.schedule: namespace {ns} would schedule 3,600 runs "
        f"per hour with this job (3,600 from it), over its cap of 3,000: space the schedule "
        "out (e.g. every minute rather than every second), or have a cluster admin raise the "
        f"cap: kubectl annotate namespace {ns} {RATE_ANNOTATION}=N --overwrite"
    ) in stderr, stderr

    # The Namespace annotation overrides the default; near the cap, kubectl shows a warning.
    kube.kubectl("annotate", "namespace", ns, f"{RATE_ANNOTATION}=4000", "--overwrite")
    warned = applied(kube, ns, sj("fast", every_second))
    assert f"Warning: namespace {ns} schedules 3,600 runs per hour, 90% of its cap" in warned
    in_store(store, operator, ns, "fast", "* * * * * *")

    # The store's jobs count: 3,600 + 1,800 is over 4,000.
    every_2s = 'schedule: "*/2 * * * * *"\ntarget: {log: {}}'
    stderr = refused(kube, ns, sj("second", every_2s))
    assert "would schedule 5,400 runs per hour with this job (1,800 from it), over its cap of " \
        "4,000" in stderr, stderr  # fmt: skip
    # Suspended, a job produces nothing and is admitted.
    applied(kube, ns, sj("second", every_2s + "\nsuspend: true"))

    # Over the cap (lowered), a change that slows a job down still passes; one that
    # speeds it up does not, and an unusable annotation falls back to the default, saying so.
    kube.kubectl("annotate", "namespace", ns, f"{RATE_ANNOTATION}=1000", "--overwrite")
    applied(kube, ns, sj("fast", 'schedule: "*/5 * * * * *"\ntarget: {log: {}}'))
    in_store(store, operator, ns, "fast", "*/5 * * * * *")
    stderr = refused(kube, ns, sj("fast", every_2s))
    assert "would schedule 1,800 runs per hour with this job (1,800 from it), over its cap " \
        "of 1,000" in stderr, stderr  # fmt: skip
    kube.kubectl("annotate", "namespace", ns, f"{RATE_ANNOTATION}=lots", "--overwrite")
    stderr = refused(kube, ns, sj("slow", 'schedule: "* * * * * *"\ntarget: {log: {}}'))
    assert (
        "would schedule 4,320 runs per hour with this job (3,600 from it), over its cap of "
        f"3,000 (the namespace's {RATE_ANNOTATION} annotation 'lots' is not a whole number "
        ">= 0, so the default applies)"
    ) in stderr, stderr


def test_http_targets_are_checked_against_the_egress_policy(
    kube: Cluster, ns: str, rate_ns: str, operator: OperatorProcess
) -> None:
    """The issue's first example, and the rest of the secure default, refused at apply."""
    for url, rule in (
        ("http://169.254.169.254/latest/meta-data",
         "host '169.254.169.254' is link-local (cloud metadata) (169.254.0.0/16)"),
        ("http://metadata.google.internal/computeMetadata/v1/",
         "host 'metadata.google.internal' is a cloud metadata host name"),
        ("https://kubernetes.default.svc/api",
         "host 'kubernetes.default.svc' is the Kubernetes API server (kubernetes.default.svc)"),
        ("http://127.0.0.1:6443/", "host '127.0.0.1' is loopback (127.0.0.0/8)"),
    ):  # fmt: skip
        stderr = refused(
            kube, ns, sj("ssrf", f'schedule: "@daily"\ntarget: {{http: {{url: "{url}"}}}}')
        )
        assert DENIED + f"ScheduledJob ssrf: spec.target.http.url: {rule}" in stderr, stderr
        assert "egress.allowCidrs/allowHosts" in stderr  # the fix
    assert kube.kubectl("get", "sj", "ssrf", "-n", ns, check=False).returncode != 0
    # A namespace tightens with its annotation (and cannot open what the cluster denies).
    kube.kubectl("annotate", "namespace", rate_ns, "cronwell.dev/egress-allow=*.example.com",
                 "--overwrite")  # fmt: skip
    try:
        stderr = refused(
            kube,
            rate_ns,
            sj("out", 'schedule: "@daily"\ntarget: {http: {url: "https://api.other.org/x"}}'),
        )
        assert (
            "spec.target.http.url: host 'api.other.org' is not in namespace "
            f"{rate_ns}'s cronwell.dev/egress-allow annotation (*.example.com)"
        ) in stderr, stderr
        applied(
            kube,
            rate_ns,
            sj("out", 'schedule: "@daily"\ntarget: {http: {url: "https://api.example.com/x"}}'),
        )
    finally:
        kube.kubectl("annotate", "namespace", rate_ns, "cronwell.dev/egress-allow-")
        kube.kubectl("delete", "sj", "out", "-n", rate_ns, "--timeout=60s", check=False)


def test_pools_and_handlers_per_namespace(
    kube: Cluster, ns: str, rate_ns: str, operator: OperatorProcess
) -> None:
    kube.apply(
        f"apiVersion: cronwell.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: payments, "
        f"namespace: {ns}}}\nspec: {{scaleTargetRef: {{name: worker-payments}}, "
        "handlers: [charge]}\n"
    )
    charge = 'schedule: "@daily"\npool: payments\ntarget: {handler: {name: charge}}'
    try:
        # Its own namespace may use it, for the handlers it serves.
        applied(kube, ns, sj("pay", charge))
        stderr = refused(kube, ns, sj("refund", charge.replace("charge", "refund")))
        assert (
            DENIED + "ScheduledJob refund: spec.target.handler.name: pool 'payments' does not "
            "serve handler 'refund' (it serves: charge): use a pool that serves it, or ask "
            "the pool's owner to add it to the pool's handlers"
        ) in stderr, stderr
        # Another namespace may not, until the WorkerPool lets it in by label.
        stderr = refused(kube, rate_ns, sj("pay", charge))
        assert (
            DENIED + f"ScheduledJob pay: spec.pool: namespace {rate_ns} may not use pool "
            f"'payments' (allowed: {ns}): use a pool of your namespace, or ask its owner to "
            f"add {rate_ns} to spec.namespaces (or a matching namespaceSelector) of the "
            f"WorkerPool payments in namespace {ns}"
        ) in stderr, stderr
        kube.kubectl("label", "namespace", rate_ns, "team=pay", "--overwrite")
        selector = '{"spec": {"namespaceSelector": {"matchLabels": {"team": "pay"}}}}'
        kube.kubectl("patch", "workerpool", "payments", "-n", ns, "--type=merge", "-p", selector)

        def admitted() -> bool:
            out = kube.kubectl("apply", "--dry-run=server", "-n", rate_ns, "-f", "-",
                               input=sj("pay", charge), check=False)  # fmt: skip
            return out.returncode == 0

        wait_until(admitted, 30, "admitted by the namespace selector")
        # A static pool's namespaces (--pool-namespaces batch=NS).
        stderr = refused(kube, rate_ns, sj("b", 'schedule: "@daily"\npool: batch\n'
                                          "target: {log: {}}"))  # fmt: skip
        assert f"namespace {rate_ns} may not use pool 'batch' (allowed: {ns})" in stderr
        assert "the pool's namespaces in the chart's worker.pools" in stderr
    finally:
        kube.kubectl("label", "namespace", rate_ns, "team-")
        kube.kubectl("delete", "sj", "pay", "-n", ns, "--timeout=60s", check=False)
        kube.kubectl("delete", "workerpool", "payments", "-n", ns, check=False)


async def test_workerpool_listing_tolerates_a_missing_crd(kube: Cluster, ns: str) -> None:
    """Without the WorkerPool CRD the API server answers 404: no WorkerPools, no error."""
    k = Kube(api_client(str(kube.kubeconfig)))
    try:
        assert await k.list_cluster_names("nosuchresources") is None
        assert await k.workerpool_names() is not None  # the CRD is installed in this module
    finally:
        k.close()


def test_a_clean_stop_removes_the_webhook(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess
) -> None:
    """So a stopped operator never blocks `kubectl apply` (kill -9 would leave it: the
    configuration then points at nothing and failurePolicy Fail refuses every write)."""
    kube.kubectl("delete", "sj", "--all", "-n", ns, "--timeout=60s")
    assert operator.stop() == 0
    assert _webhooks(kube) == []
    kube.kubectl("apply", "-n", ns, "-f", "-", input=sj("after", 'schedule: "@daily"\n'
                 "target: {log: {}}"))  # fmt: skip


@pytest.mark.parametrize(
    "schedule",
    ["* * * * *", "*/5 * * * *", "H/15 * * * *", "H H * * *", "@hourly", "@daily",
     "*/10 * * * * *", "0 9-17 * * MON-FRI", "H(0-29)/10 * * * *", "0-30/7 * 1 * * *"],
)  # fmt: skip
def test_a_schedule_rate_is_its_runs_on_a_day_it_runs(schedule: str) -> None:
    """The closed form (the parsed fields) equals the engine's own count over a day it runs."""
    from datetime import UTC, datetime, timedelta

    from cronwell.cronexpr import load_zone
    from cronwell.schedule import CronSchedule
    from cronwell_operator.webhook import occurrences_per_hour

    day = datetime(2024, 1, 3, tzinfo=UTC)  # a Wednesday
    sched = CronSchedule(schedule, load_zone("UTC"), hash_id="rate")
    runs, t = 0, sched.next_after(day - timedelta(microseconds=1))
    while t is not None and t < day + timedelta(days=1):
        runs, t = runs + 1, sched.next_after(t)
    assert occurrences_per_hour(schedule) * 24 == pytest.approx(runs)
    assert occurrences_per_hour(None) == 1  # a one-shot
