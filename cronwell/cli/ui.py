"""`cronwell ui`: the web dashboard, bound to loopback unless told otherwise, read-only
unless started with --allow-actions, and open to whoever reaches it unless started with
--auth kubernetes (then every request needs a Kubernetes bearer token and sees only the
namespaces its user may list ScheduledJobs in)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import click

from cronwell.cli.main import Env, main, run_until_signal

log = logging.getLogger(__name__)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@main.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8480, show_default=True)
@click.option(
    "--allow-actions",
    is_flag=True,
    default=False,
    help="Allow the dashboard's POST actions (dead-letter replay and discard; trigger, "
    "suspend/resume and backfill on a job's page); off: read-only.",
)
@click.option(
    "--auth",
    type=click.Choice(["none", "kubernetes"]),
    default="none",
    show_default=True,
    help="none: no authentication (keep it on loopback). kubernetes: every request needs "
    "`Authorization: Bearer <token>`, checked with a TokenReview; a namespace is shown only "
    "if a SubjectAccessReview allows its user to list scheduledjobs there (status and "
    "forecast: in every namespace), an action only if it allows update. Uses the Pod's "
    "ServiceAccount in a cluster, else KUBECONFIG; the job actions then patch the "
    "ScheduledJob (trigger annotation, spec.suspend) with it.",
)
@click.option(
    "--auth-audience",
    default=None,
    metavar="AUDIENCE",
    help="With --auth kubernetes: accept only tokens issued for this audience (e.g. "
    "`kubectl create token SA --audience AUDIENCE`), so a token given to the dashboard is "
    "not one the API server itself accepts. Default: the API server's own audiences.",
)
@click.pass_obj
def ui_cmd(
    env: Env, host: str, port: int, allow_actions: bool, auth: str, auth_audience: str | None
) -> None:
    """Serve the web dashboard until SIGTERM/SIGINT."""
    from aiohttp import web

    from cronwell.ui.app import UiConfig, make_app

    if auth_audience is not None and auth != "kubernetes":
        raise click.UsageError("--auth-audience needs --auth kubernetes")
    kube = None
    if auth == "kubernetes":
        from kubernetes.config import ConfigException

        from cronwell.kubejson import api_client
        from cronwell.ui.auth import KubeAuth

        try:
            kube = KubeAuth(api_client(), audience=auth_audience)
        except (ConfigException, OSError) as e:
            raise click.ClickException(
                f"--auth kubernetes needs the API server: no in-cluster config and no usable "
                f"kubeconfig ({e}); set KUBECONFIG"
            ) from None
    elif not _loopback(host):
        click.echo(
            f"warning: cronwell ui on {host} without authentication: anyone who reaches the "
            "port sees every namespace (use --auth kubernetes)",
            err=True,
        )
    stop = asyncio.Event()

    async def go() -> None:
        async with env.database(reads=True) as db:
            config = UiConfig(
                db=db, allow_actions=allow_actions, auth=kube, kube=kube.api if kube else None
            )
            runner = web.AppRunner(make_app(config))
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port).start()
                log.info("cronwell ui on http://%s:%s/ (auth: %s)", host, port, auth)
                await stop.wait()
            finally:
                await runner.cleanup()

    try:
        run_until_signal(go, stop.set)
    finally:
        if kube is not None:
            kube.close()
