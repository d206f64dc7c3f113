"""`cronwell operator`, added to `cronwell` through the `cronwell.cli` entry points."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
import pydantic

from cronwell.cli import Env, invalid_setting, metrics_port_option, run_until_signal
from cronwell.kubejson import api_client
from cronwell.metrics import Metrics
from cronwell_operator.kube import Kube
from cronwell_operator.leader import LeadershipLost
from cronwell_operator.runner import Operator
from cronwell_operator.settings import OperatorSettings


def _drop_kopf_extras(record: logging.LogRecord) -> bool:
    """kopf attaches its whole settings object and API references to every record; keep
    the object's namespace/name and drop the rest (one readable line per event)."""
    ref = record.__dict__.pop("k8s_ref", None)
    for noise in ("settings", "k8s_skip"):
        record.__dict__.pop(noise, None)
    if isinstance(ref, dict) and "name" in ref:
        record.__dict__["object"] = f"{ref.get('namespace', '')}/{ref['name']}"
    return True


@click.command("operator")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve only this namespace (repeatable). Default: the whole cluster.",
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: KUBECONFIG.")
@click.option(
    "--leader-election/--no-leader-election",
    default=None,
    help="Hold a Lease so one replica reconciles at a time (default on).",
)
@click.option("--lease-namespace", help="Namespace of the Lease (default 'default').")
@click.option("--lease-name", help="Name of the Lease (default 'cronwell-operator').")
@click.option("--identity", help="Lease holder identity (default POD_NAME or host-pid).")
@click.option("--lease-duration-seconds", type=float)
@click.option("--renew-deadline-seconds", type=float)
@click.option("--retry-period-seconds", type=float)
@click.option("--status-qps", type=float, help="Status patches + Events per second (20).")
@click.option("--status-burst", type=int, help="Burst above the QPS (40).")
@click.option(
    "--prescale/--no-prescale",
    default=None,
    help="Scale WorkerPool Deployments ahead of forecast bursts (default on).",
)
@click.option("--scale-interval-seconds", type=float, help="Longest pause between forecasts (5).")
@click.option("--forecast-horizon-seconds", type=float, help="How far ahead to forecast (900).")
@click.option("--webhook-port", type=int, help="Serve the validating webhook (HTTPS).")
@click.option("--webhook-addr", help="Listen address of the webhook (0.0.0.0).")
@click.option(
    "--webhook-host",
    help="Host the API server calls; set it to let the operator manage the "
    "ValidatingWebhookConfiguration 'cronwell.dev'.",
)
@click.option("--webhook-cert-dir", help="tls.crt/tls.key (self-signed if missing).")
@click.option(
    "--pool",
    "pools",
    multiple=True,
    help="A static worker pool (repeatable; default 'default'): admission accepts these "
    "pools and every WorkerPool's name.",
)
@click.option(
    "--pool-namespaces",
    "pool_namespaces",
    multiple=True,
    metavar="POOL=NS,NS",
    help="Namespaces that may use a static pool ('*': any, the default); repeatable.",
)
@click.option(
    "--pool-handlers",
    "pool_handlers",
    multiple=True,
    metavar="POOL=H,H",
    help="Handlers a static pool serves (default: any); repeatable.",
)
@click.option(
    "--webhook-require-known-pool/--no-webhook-require-known-pool",
    default=None,
    help="Refuse a spec.pool that is neither a WorkerPool nor a static pool (default on).",
)
@click.option(
    "--webhook-max-occurrences-per-hour",
    type=int,
    help="Cap on a namespace's runs per hour (60000); the Namespace annotation "
    "cronwell.dev/max-occurrences-per-hour overrides it.",
)
@metrics_port_option
@click.pass_obj
def operator(
    env: Env,
    /,
    kubeconfig: str | None,
    namespaces: tuple[str, ...],
    metrics_port: int,
    **opts: Any,
) -> None:
    """Run the Kubernetes operator: ScheduledJob CRs into the store (create, update, suspend,
    trigger, delete with a finalizer, drift repair) and results back into their status."""
    given = {k: v for k, v in opts.items() if v is not None and v != ()}
    for key in ("pool_namespaces", "pool_handlers"):
        if key in given:
            pairs = [item.partition("=") for item in given[key]]
            if any(not sep or not pool for pool, sep, _ in pairs):
                raise click.BadParameter(f"use POOL=A,B (got {given[key]!r})", param_hint=key)
            given[key] = {pool: value for pool, _, value in pairs}
    if namespaces:
        given["namespaces"] = list(namespaces)
    try:
        settings = OperatorSettings.from_flat(given)
    except pydantic.ValidationError as e:
        raise invalid_setting(e) from None
    for h in logging.getLogger().handlers:
        h.addFilter(_drop_kopf_extras)
    # Served by every replica, leader or standby (readiness probes may point at it).
    metrics = Metrics()
    metrics.serve(metrics_port)
    holder: list[Operator] = []

    async def go() -> None:
        kube = Kube(api_client(kubeconfig))
        try:
            async with env.database(migrate_first=True, reads=True) as db:
                op = Operator(db, kube, settings, metrics=metrics)
                holder.append(op)
                await op.run()
        finally:
            kube.close()

    try:
        run_until_signal(go, lambda: holder[0].stop() if holder else None)
    except LeadershipLost as e:
        click.secho(f"error: {e}; exiting so that a restart rejoins as a standby", err=True)
        sys.exit(3)
