"""`kubectl cronwell ...`: the kubectl plugin (console script `kubectl-cronwell`; kubectl
runs any `kubectl-<name>` found on PATH).

Commands that read or change the ScheduledJob go through the API server, as a user with
kubectl would (trigger and suspend write only what the operator watches: the trigger
annotation and spec.suspend). Commands that show history (runs, dlq) read the store, which
the API server does not hold: they need the database URL. No kopf here: the plugin is a
client, not a controller.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cronwell import kubejson, logs
from cronwell.cli import given_url, render_dead, render_runs, run
from cronwell.kubejson import api_client
from cronwell.models import GROUP, VERSION
from cronwell.schedule import trigger_key
from cronwell.settings import DatabaseSettings
from cronwell.store import dead, runs
from cronwell.store.db import Database
from cronwell.store.replica import reads_from
from cronwell_operator.kube import PLURAL

#: The annotation the operator watches (kopf_handlers.py): each new value requests one run.
TRIGGER_ANNOTATION = f"{GROUP}/trigger"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DATABASE_HELP = (
    "PostgreSQL URL of the cronwell store (runs and dlq read it; the API server does not "
    "hold history). From a laptop, port-forward the database and point this at "
    "127.0.0.1, e.g. `kubectl -n DB_NS port-forward svc/POSTGRES 5432:5432`; or run the "
    "plugin where the URL already is, in the operator's Pod: `kubectl -n cronwell exec "
    "deploy/cronwell-operator -- kubectl-cronwell runs NAME -n NS` (Helm release "
    "`cronwell`; the chart mounts the URL and sets CRONWELL_DATABASE_URL_FILE)."
)


@dataclass
class Plugin:
    """Connection settings from the global options; clients are made on first use, so
    `--help` works without a kubeconfig."""

    kubeconfig: str | None
    context: str | None
    database_url: str | None
    database_url_file: str | None
    database_read_url: str | None = None
    database_read_url_file: str | None = None
    _api: client.ApiClient | None = field(default=None, repr=False)

    def api(self) -> client.ApiClient:
        if self._api is None:
            try:
                if self.context is None:
                    self._api = api_client(self.kubeconfig)
                else:
                    self._api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                        config_file=self.kubeconfig, context=self.context
                    )
            except (config.ConfigException, OSError) as e:
                fail(f"no usable kubeconfig: {e} (set KUBECONFIG or pass --kubeconfig)")
        return self._api

    def default_namespace(self) -> str:
        """The kubeconfig context's namespace, as kubectl uses (in a Pod: the Pod's)."""
        if self.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                return _SA_NAMESPACE.read_text().strip() or "default"
            except OSError:
                return "default"
        try:
            contexts, current = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                self.kubeconfig
            )
        except (config.ConfigException, OSError) as e:
            fail(f"no usable kubeconfig: {e} (set KUBECONFIG or pass --kubeconfig)")
        if self.context is not None:
            current = next((c for c in contexts if c["name"] == self.context), None)
            if current is None:
                fail(f"context {self.context!r} is not in the kubeconfig")
        ns: str = (current or {}).get("context", {}).get("namespace") or "default"
        return ns

    def url(self) -> str:
        if self.database_url:
            return self.database_url
        if self.database_url_file:
            try:
                text = Path(self.database_url_file).read_text().strip()
            except OSError as e:
                fail(f"cannot read CRONWELL_DATABASE_URL_FILE {self.database_url_file}: {e}")
            if text:
                return text
        fail(
            "no database configured: runs and dlq read the cronwell store; pass "
            "--database-url or set CRONWELL_DATABASE_URL (see `kubectl cronwell --help`)"
        )


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def _kube(what: str, call: Callable[[], Any], host: str) -> dict[str, Any]:
    """One API call; its failures as one line (what failed and what to check)."""
    try:
        obj: dict[str, Any] = call()
        return obj
    except ApiException as e:
        if e.status == 404:
            fail(f"{what}: not found (`kubectl get sj -n NAMESPACE` lists them)")
        if e.status in (401, 403):
            fail(f"{what}: HTTP {e.status} {e.reason}: your kubeconfig user may not do this")
        fail(f"{what}: HTTP {e.status} {e.reason}")
    except (HTTPError, OSError) as e:
        fail(f"{what}: cannot reach the API server at {host}: {type(e).__name__}")


class _Objects:
    """The few ScheduledJob calls the plugin makes."""

    def __init__(self, plugin: Plugin):
        api = plugin.api()
        self.custom = client.CustomObjectsApi(api)
        self.host = api.configuration.host

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return _kube(
            f"ScheduledJob {namespace}/{name}",
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            ),
            self.host,
        )

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _kube(
            f"ScheduledJob {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            ),
            self.host,
        )


@contextlib.asynccontextmanager
async def _store(plugin: Plugin) -> AsyncIterator[Database]:
    """The store, its reads on the read replica when one is given (--database-read-url)."""
    read_file = plugin.database_read_url_file
    read_url = given_url(
        plugin.database_read_url,
        Path(read_file) if read_file else None,
        "CRONWELL_DATABASE_READ_URL",
    )
    s, name = DatabaseSettings(), "kubectl-cronwell"
    async with (
        Database(plugin.url(), min_size=1, max_size=1, application_name=name) as db,
        reads_from(
            db,
            read_url,
            max_lag_seconds=s.database_read_max_lag_seconds,
            check_seconds=s.database_read_check_seconds,
            max_size=1,
            application_name=name,
        ),
    ):
        yield db


async def _runs(plugin: Plugin, job_id: uuid.UUID, state: str | None, limit: int) -> list[runs.Run]:
    async with _store(plugin) as db:
        return await runs.list_for_job(db.reads, job_id=job_id, state=state, limit=limit)


async def _dead(plugin: Plugin, ns: str | None, name: str | None, limit: int) -> list[dead.Dead]:
    async with _store(plugin) as db:
        return await dead.list_dead(db.reads, namespace=ns, name=name, limit=limit)


namespace_option = click.option(
    "-n", "--namespace", default=None, help="Default: the kubeconfig context's namespace."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--kubeconfig", help="Default: KUBECONFIG, else ~/.kube/config.")
@click.option("--context", help="kubeconfig context (default: the current one).")
@click.option("--database-url", envvar="CRONWELL_DATABASE_URL", help=DATABASE_HELP)
@click.option("--database-url-file", envvar="CRONWELL_DATABASE_URL_FILE", hidden=True)
@click.option(
    "--database-read-url",
    envvar="CRONWELL_DATABASE_READ_URL",
    help="A streaming replica of the store for runs and dlq (they fall back to "
    "--database-url when it lags or is down).",
)
@click.option("--database-read-url-file", envvar="CRONWELL_DATABASE_READ_URL_FILE", hidden=True)
@click.pass_context
def plugin(
    ctx: click.Context,
    kubeconfig: str | None,
    context: str | None,
    database_url: str | None,
    database_url_file: str | None,
    database_read_url: str | None,
    database_read_url_file: str | None,
) -> None:
    """cronwell from kubectl: status, runs, trigger, suspend/resume, dead letters, the
    dashboard.

    `trigger`, `suspend`, `resume`, `status` and `ui` talk to the API server only. `runs` and `dlq`
    also read the cronwell store: give --database-url (or CRONWELL_DATABASE_URL)."""
    logs.setup("ERROR")  # a client: its failures are the one-line errors below, not logs
    ctx.obj = Plugin(
        kubeconfig,
        context,
        database_url,
        database_url_file,
        database_read_url,
        database_read_url_file,
    )


@plugin.command("runs")
@click.argument("name")
@namespace_option
@click.option("--state", default=None, help="Only this state (succeeded, dead, missed, ...).")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def runs_cmd(
    p: Plugin, name: str, namespace: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """Recent occurrences of ScheduledJob NAME (its uid's rows in the store), newest first."""
    ns = namespace or p.default_namespace()
    uid = _Objects(p).get(ns, name)["metadata"]["uid"]
    render_runs(run(_runs(p, uuid.UUID(uid), state, limit)), as_json=as_json)


@plugin.command("dlq")
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@click.option("--job", "name", default=None, help="Only this job (NAME).")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def dlq_cmd(
    p: Plugin,
    namespace: str | None,
    all_namespaces: bool,
    name: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Dead-lettered occurrences, newest first, with reason and last error. To replay or
    purge them use `cronwell dlq replay|purge` against the same database."""
    ns = None if all_namespaces else namespace or p.default_namespace()
    render_dead(run(_dead(p, ns, name, limit)), as_json=as_json)


@plugin.command("trigger")
@click.argument("name")
@namespace_option
@click.option("--id", "trigger_id", help="Trigger id (default: a new one); an id runs once.")
@click.pass_obj
def trigger_cmd(p: Plugin, name: str, namespace: str | None, trigger_id: str | None) -> None:
    """Run NAME now: sets the cronwell.dev/trigger annotation, which the operator turns into
    one occurrence with key <uid>:trigger:<id>. The same id never runs twice."""
    ns = namespace or p.default_namespace()
    objects = _Objects(p)
    obj = objects.get(ns, name)
    value = trigger_id or (
        f"kubectl-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}"
    )
    current = (obj["metadata"].get("annotations") or {}).get(TRIGGER_ANNOTATION)
    key = trigger_key(obj["metadata"]["uid"], value)
    if current == value:
        click.echo(f"{ns}/{name}: trigger {value} was already requested (key {key}); no-op")
        return
    objects.patch(ns, name, {"metadata": {"annotations": {TRIGGER_ANNOTATION: value}}})
    click.echo(f"{ns}/{name}: requested trigger {value}")
    click.echo(f"idempotency key: {key}")


def _set_suspend(p: Plugin, name: str, namespace: str | None, value: bool) -> None:
    ns = namespace or p.default_namespace()
    _Objects(p).patch(ns, name, {"spec": {"suspend": value}})
    click.echo(f"{ns}/{name}: spec.suspend={str(value).lower()}")
    click.echo(
        "note: this edits spec; if Argo CD / Flux manage this ScheduledJob, make the same "
        "change in Git or the next sync reverts it",
        err=True,
    )


_GITOPS = (
    " This patches spec.suspend, so a GitOps tool (Argo CD, Flux) reverts it at its next "
    "sync unless Git says the same; for an incident stop that Git does not see, use "
    "`cronwell pause` (the store)."
)


@plugin.command("suspend", help="Suspend NAME (spec.suspend=true)." + _GITOPS)
@click.argument("name")
@namespace_option
@click.pass_obj
def suspend_cmd(p: Plugin, name: str, namespace: str | None) -> None:
    _set_suspend(p, name, namespace, True)


@plugin.command("resume", help="Resume NAME (spec.suspend=false)." + _GITOPS)
@click.argument("name")
@namespace_option
@click.pass_obj
def resume_cmd(p: Plugin, name: str, namespace: str | None) -> None:
    _set_suspend(p, name, namespace, False)


@plugin.command("status")
@click.argument("name")
@namespace_option
@click.pass_obj
def status_cmd(p: Plugin, name: str, namespace: str | None) -> None:
    """NAME's status in a few lines: schedule, next and last run, failures, conditions."""
    ns = namespace or p.default_namespace()
    obj = _Objects(p).get(ns, name)
    for line in status_lines(obj):
        click.echo(line)


def status_lines(obj: dict[str, Any]) -> list[str]:
    """The condensed status of a ScheduledJob object (as the API server returns it)."""
    meta, spec, st = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    what = (
        f"{spec['schedule']!r} ({spec.get('timeZone', 'UTC')})"
        if spec.get("schedule")
        else f"runAt {spec.get('runAt')}"
    )
    gen, seen = meta.get("generation"), st.get("observedGeneration")
    last = st.get("lastResult") or "-"
    if st.get("lastDuration"):
        last += f" in {st['lastDuration']}"
    counters = st.get("counters") or {}
    lines = [
        f"ScheduledJob {meta['namespace']}/{meta['name']} (uid {meta['uid']})",
        f"  schedule:    {what}, suspend={str(bool(spec.get('suspend'))).lower()}",
        f"  generation:  {gen}, observed {seen if seen is not None else '-'}"
        + ("" if seen == gen else " (the operator has not applied the latest spec yet)"),
        f"  next run:    {st.get('nextScheduleTime') or '-'}",
        f"  last run:    {st.get('lastScheduleTime') or '-'}: {last}",
        f"  last success {st.get('lastSuccessfulTime') or '-'}, last failure "
        f"{st.get('lastFailureTime') or '-'}",
        f"  active {st.get('activeCount', 0)}, "
        f"failures in a row {st.get('consecutiveFailures', 0)}; "
        + ", ".join(
            f"{k}={counters.get(k, 0)}"
            for k in ("succeeded", "failed", "dead", "missed", "skipped")
        ),
        "  conditions:",
    ]
    conds = st.get("conditions") or []
    for c in conds:
        lines.append(f"    {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}")
    if not conds:
        lines.append("    (none yet: is the operator running for this namespace?)")
    return lines


#: Labels of the chart's dashboard Service (templates/ui.yaml).
UI_SELECTOR = "app.kubernetes.io/part-of=cronwell,app.kubernetes.io/component=ui"


def _ui_service(p: Plugin, ns: str, release: str | None) -> dict[str, Any]:
    """The chart's dashboard Service in `ns` (of `release` when several releases have one)."""
    api = p.api()
    selector = UI_SELECTOR + (f",app.kubernetes.io/instance={release}" if release else "")
    found = _kube(
        f"Services in namespace {ns}",
        lambda: kubejson.request(
            api, "GET", f"/api/v1/namespaces/{ns}/services", [("labelSelector", selector)]
        ),
        api.configuration.host,
    )["items"]
    if not found:
        fail(
            f"no cronwell dashboard Service in namespace {ns}: install the chart with "
            "--set ui.enabled=true (or pass -n NAMESPACE of the release)"
        )
    if len(found) > 1:
        names = ", ".join(
            s["metadata"]["labels"].get("app.kubernetes.io/instance", "?") for s in found
        )
        fail(f"several cronwell dashboards in namespace {ns} (releases {names}): pass --release")
    svc: dict[str, Any] = found[0]
    return svc


def _ui_audience(p: Plugin, ns: str, name: str) -> str | None:
    """The `--auth-audience` of the dashboard's Deployment (same name as its Service), if
    the user may read it: a token for another audience is refused."""
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"
    try:
        deploy = kubejson.request(p.api(), "GET", path)
    except (ApiException, HTTPError, OSError):
        return None
    for c in deploy["spec"]["template"]["spec"]["containers"]:
        for arg in c.get("args") or []:
            if arg.startswith("--auth-audience="):
                return str(arg.split("=", 1)[1])
    return None


def ui_help(ns: str, local: str, audience: str | None) -> list[str]:
    """What a user needs to open the dashboard: where, which token, how to send it. The
    dashboard reads the token from the Authorization header only (never a query or a
    cookie, which would leak it into logs and history)."""
    flag = f" --audience {audience}" if audience else ""
    return [
        f"cronwell dashboard: http://127.0.0.1:{local}/",
        "Every request needs a Kubernetes bearer token in the header",
        "  Authorization: Bearer TOKEN",
        f"e.g. a ServiceAccount's: TOKEN=$(kubectl create token SERVICEACCOUNT -n {ns}{flag})",
        f'  curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:{local}/',
        "A browser does not send it by itself: use an extension or a local proxy that adds "
        "the header. You see the namespaces where the token's user may list scheduledjobs "
        "and may act where it may update them.",
    ]


@plugin.command("ui")
@namespace_option
@click.option("--release", default=None, help="Helm release, when several have a dashboard.")
@click.option(
    "--local-port",
    type=click.IntRange(0, 65535),
    default=8480,
    show_default=True,
    help="Port on 127.0.0.1 (0: any free one, kubectl prints it).",
)
@click.option(
    "--pod-running-timeout",
    default="1m",
    show_default=True,
    help="How long kubectl port-forward waits for a running dashboard pod.",
)
@click.pass_obj
def ui_cmd(
    p: Plugin, namespace: str | None, release: str | None, local_port: int, pod_running_timeout: str
) -> None:
    """Open the chart's dashboard (ui.enabled) on 127.0.0.1: prints the URL and how to get
    and send a token, then runs `kubectl port-forward` to its Service until Ctrl-C."""
    ns = namespace or p.default_namespace()
    svc = _ui_service(p, ns, release)
    name = svc["metadata"]["name"]
    port = svc["spec"]["ports"][0]["port"]
    local = str(local_port) if local_port else "PORT"
    for line in ui_help(ns, local, _ui_audience(p, ns, name)):
        click.echo(line)
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        fail("kubectl is not on PATH (the port-forward runs it)")
    argv = [kubectl, "port-forward", "--address", "127.0.0.1", "-n", ns]
    argv += [f"--pod-running-timeout={pod_running_timeout}"]
    argv += [f"--kubeconfig={p.kubeconfig}"] if p.kubeconfig else []
    argv += [f"--context={p.context}"] if p.context else []
    argv += [f"svc/{name}", f"{local_port or ''}:{port}"]
    sys.stdout.flush()
    os.execv(kubectl, argv)


def main() -> None:
    """Console script `kubectl-cronwell`."""
    plugin(prog_name="kubectl cronwell")
