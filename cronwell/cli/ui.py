"""`cronwell ui`: the web dashboard, bound to loopback unless told otherwise and read-only
unless started with --allow-actions."""

from __future__ import annotations

import asyncio

import click

from cronwell.cli.main import Env, main, run_until_signal


@main.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8480, show_default=True)
@click.option(
    "--allow-actions",
    is_flag=True,
    default=False,
    help="Allow the dashboard's POST actions (dead-letter replay and discard); off: read-only.",
)
@click.pass_obj
def ui_cmd(env: Env, host: str, port: int, allow_actions: bool) -> None:
    """Serve the web dashboard until SIGTERM/SIGINT."""
    from aiohttp import web

    from cronwell.ui.app import UiConfig, make_app

    stop = asyncio.Event()

    async def go() -> None:
        async with env.database() as db:
            runner = web.AppRunner(make_app(UiConfig(db=db, allow_actions=allow_actions)))
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port).start()
                click.echo(f"cronwell ui on http://{host}:{port}/", err=True)
                await stop.wait()
            finally:
                await runner.cleanup()

    run_until_signal(go, stop.set)
