"""One operator replica.

Standby: waits for the Lease; if a webhook port is set it already serves the admission
webhook (a kopf instance with only that handler), so admission never depends on which
replica leads, and every replica is Ready behind the webhook Service.

Leader: repairs drift, then runs kopf with every handler, the status writer and the
pre-scaler (WorkerPools; unless `prescale` is off) until stopped, or until the Lease is
lost, which ends the process with an error so that Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

import kopf

from cronwell.metrics import Metrics
from cronwell.store.db import Database
from cronwell.store.migrate import check_schema
from cronwell_operator import drift, kopf_handlers, tenancy_sync
from cronwell_operator.kube import Kube
from cronwell_operator.leader import LeaderElector, LeadershipLost
from cronwell_operator.scaler import Scaler
from cronwell_operator.settings import OperatorSettings
from cronwell_operator.status import StatusWriter

log = logging.getLogger(__name__)


@dataclass
class _Kopf:
    """One running kopf instance."""

    task: asyncio.Task[None]
    stop: asyncio.Future[None]
    ready: asyncio.Future[None]

    async def shutdown(self, timeout: float = 30) -> None:
        if not self.stop.done():
            self.stop.set_result(None)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
            async with asyncio.timeout(timeout):
                await self.task


class Operator:
    def __init__(
        self,
        db: Database,
        kube: Kube,
        settings: OperatorSettings,
        metrics: Metrics | None = None,
    ):
        self.db = db
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.stop_event = asyncio.Event()
        self.ready = asyncio.Event()
        self.elector = LeaderElector(kube, settings)
        self.writer = StatusWriter(db, kube, settings, metrics=self.metrics)
        self.scaler = Scaler(db, kube, settings, self.metrics)
        self.secrets = tenancy_sync.box_from_env()
        self.tenancy = tenancy_sync.TenancySync(db, kube, settings, self.secrets)

    def stop(self) -> None:
        self.stop_event.set()

    async def _take_back_signals(self) -> None:
        """kopf installs its own SIGTERM/SIGINT handlers when it starts; route them back to
        stop() so that a shutdown goes through our stop flag (kopf then exits at once
        instead of waiting 5 s for its stop-flag waiter, and the Lease is released).

        kopf installs them at the end of its start-up, which can finish just after its
        ready flag is set: yield a moment first so that ours are the last installed."""
        if threading.current_thread() is not threading.main_thread():
            return
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)

    def _start_kopf(self, *, leader: bool) -> _Kopf:
        s = self.settings
        registry = kopf.OperatorRegistry()
        kopf_settings = kopf.OperatorSettings()
        kopf_handlers.configure(kopf_settings, s, manage_webhook=leader)
        ctx = kopf_handlers.HandlerDeps(
            self.db,
            self.kube,
            s,
            self.writer if leader else None,
            metrics=self.metrics,
            secrets=self.secrets,
        )
        kopf_handlers.register(registry, ctx, webhook_only=not leader)
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[None] = loop.create_future()
        ready: asyncio.Future[None] = loop.create_future()
        task = asyncio.create_task(
            kopf.operator(
                registry=registry,
                settings=kopf_settings,
                standalone=True,  # no kopf peering: the Lease elects the leader
                clusterwide=not s.namespaces,
                namespaces=s.namespaces,
                stop_flag=stop,
                ready_flag=ready,
            ),
            name="kopf",
        )
        return _Kopf(task, stop, ready)

    async def _wait_listening(self, instance: _Kopf, timeout: float = 60) -> None:
        """kopf opens the webhook port only after its first API scan: wait for it."""
        addr = self.settings.webhook.addr
        host = "127.0.0.1" if addr in ("0.0.0.0", "") else "::1" if addr == "::" else addr
        deadline = asyncio.get_running_loop().time() + timeout
        while not instance.task.done() and not self.stop_event.is_set():
            try:
                _, writer = await asyncio.open_connection(host, self.settings.webhook.port)
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("the webhook port is still closed", extra={"action": "webhook"})
                    return
                await asyncio.sleep(0.1)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def _standby(self) -> bool:
        """Wait for the Lease (serving the webhook meanwhile); True once leading."""
        webhook: _Kopf | None = None
        if self.settings.webhook.port is not None:
            webhook = self._start_kopf(leader=False)
            waiting: list[asyncio.Future[Any]] = [webhook.ready, webhook.task]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if webhook.task.done():
                await webhook.task  # it failed: raise why
            await self._take_back_signals()
            await self._wait_listening(webhook)
            log.info("standby: serving the webhook", extra={"action": "standby_webhook"})
        try:
            return await self.elector.acquire(self.stop_event)
        finally:
            if webhook is not None:
                await webhook.shutdown()

    async def run(self) -> None:
        s = self.settings
        await check_schema(self.db)
        if s.leadership.enabled and not await self._standby():
            return
        tasks: list[asyncio.Task[None]] = []
        stopper: asyncio.Future[Any] | None = None
        instance: _Kopf | None = None
        try:
            await drift.tombstone_orphans(self.db, self.kube, s.namespaces)
            # Every task of ours exists before kopf starts: kopf treats tasks created after
            # its start as its own and, on exit, waits up to 5 s for them before cancelling.
            stopper = asyncio.create_task(self.stop_event.wait(), name="stop")
            tasks.append(asyncio.create_task(self.writer.run(), name="status-writer"))
            tasks.append(asyncio.create_task(self.tenancy.run(), name="tenancy-sync"))
            if s.scaling.enabled:
                tasks.append(asyncio.create_task(self.scaler.run(), name="pre-scaler"))
            if s.leadership.enabled:
                tasks.append(asyncio.create_task(self.elector.keep(), name="lease"))
            instance = self._start_kopf(leader=True)
            tasks.append(instance.task)
            waiting: list[asyncio.Future[Any]] = [*tasks, instance.ready]
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if instance.ready in done:
                await self._take_back_signals()
                self.ready.set()
                log.info("operator ready", extra={"action": "operator_ready"})
                waiting = [*tasks, stopper]
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and not t.cancelled() and (exc := t.exception()) is not None:
                    raise exc
        finally:
            if stopper is not None:
                stopper.cancel()
            for t in tasks:
                if instance is None or t is not instance.task:
                    t.cancel()
            if instance is not None:
                await instance.shutdown()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.elector.release()
        log.info("operator stopped", extra={"action": "operator_stop"})


__all__ = ["LeadershipLost", "Operator"]
