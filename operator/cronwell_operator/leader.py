"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

Why a Lease and not kopf's peering: peering pauses operators of a *lower* priority, but
replicas of the same priority keep running side by side (kopf only warns), which is no
leader election. The Lease gives one holder at a time:

- a standby takes the Lease only when its holder has not renewed it for
  `lease_duration_seconds`, measured on the standby's own clock from the moment it last
  saw the record change (no comparison of clocks across machines);
- every write is a replace with the resourceVersion that was read, so two standbys racing
  for an expired Lease cannot both win (one gets 409 Conflict);
- the leader renews every `retry_period_seconds`; if it could not renew for
  `renew_deadline_seconds` (< lease duration) it stops reconciling *before* a standby can
  take over, then exits so that Kubernetes restarts it as a standby;
- on a clean shutdown the leader releases the Lease (empty holder) so a standby takes over
  at its next retry instead of waiting out the lease duration.

Limits, honestly: the guarantee rests on the leader's timers firing on time. A leader
paused (SIGSTOP, a long GC, a frozen VM) longer than the lease duration can wake up still
believing it leads until its next renewal fails. Nothing the operator writes depends on
being alone, though: store writes are idempotent upserts keyed by CR uid and status
patches are recomputed from the store, so an overlap costs duplicate work, not wrong data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from kubernetes import client

from cronwell.supervise import wait_event
from cronwell_operator.kube import Kube, KubeConflict, KubeError
from cronwell_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """The leader could not renew its Lease within the renew deadline."""


class LeaderElector:
    def __init__(self, kube: Kube, settings: OperatorSettings):
        self.kube = kube
        self.s = settings.leadership
        self.identity = settings.identity
        self.is_leader = False
        self._observed_record: tuple[str | None, str | None] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    # -- one attempt -----------------------------------------------------------------

    def _spec(self, *, acquire: datetime | None, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=max(1, round(self.s.lease_duration_seconds)),
            acquire_time=acquire,
            renew_time=datetime.now(UTC),
            lease_transitions=transitions,
        )

    async def try_acquire_or_renew(self) -> bool:
        """One step of the election; True when this replica holds the Lease afterwards."""
        ns, name = self.s.lease_namespace, self.s.lease_name
        now = time.monotonic()
        lease = await self.kube.get_lease(ns, name)
        if lease is None:
            fresh = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name, namespace=ns),
                spec=self._spec(acquire=datetime.now(UTC), transitions=0),
            )
            try:
                await self.kube.create_lease(ns, fresh)
            except KubeConflict:
                return False
            return self._won(now, transitions=0)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or None
        record = (holder, spec.renew_time.isoformat() if spec.renew_time else None)
        if record != self._observed_record:
            self._observed_record = record
            self._observed_at = now
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            new_spec = self._spec(acquire=spec.acquire_time, transitions=transitions)
        else:
            duration = float(spec.lease_duration_seconds or self.s.lease_duration_seconds)
            if holder is not None and now < self._observed_at + duration:
                return self._lost_if_leader()
            transitions += 1
            new_spec = self._spec(acquire=datetime.now(UTC), transitions=transitions)
        lease.spec = new_spec
        try:
            await self.kube.replace_lease(ns, lease)
        except KubeConflict:
            return self._lost_if_leader()
        return self._won(now, transitions=transitions)

    def _won(self, now: float, *, transitions: int) -> bool:
        self._last_renew = now
        if not self.is_leader:
            self.is_leader = True
            log.info(
                "became the leader",
                extra={
                    "action": "leader_acquired",
                    "identity": self.identity,
                    "lease": f"{self.s.lease_namespace}/{self.s.lease_name}",
                    "transitions": transitions,
                },
            )
        return True

    def _lost_if_leader(self) -> bool:
        if self.is_leader:
            self.is_leader = False
            log.warning("another replica holds the lease", extra={"action": "leader_lost"})
        return False

    # -- loops -----------------------------------------------------------------------

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        log.info(
            "waiting for the lease",
            extra={"action": "leader_wait", "identity": self.identity},
        )
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return True
            except KubeError as e:
                log.warning(
                    "lease attempt failed", extra={"action": "lease_error", "error": str(e)}
                )
            await wait_event(stop, self.s.retry_period_seconds)
        return False

    async def keep(self) -> None:
        """Renew until cancelled; raise LeadershipLost past the renew deadline."""
        while True:
            await asyncio.sleep(self.s.retry_period_seconds)
            try:
                async with asyncio.timeout(self.s.renew_deadline_seconds):
                    ok = await self.try_acquire_or_renew()
            except (KubeError, TimeoutError) as e:
                log.warning(
                    "lease renewal failed", extra={"action": "lease_error", "error": str(e)}
                )
                ok = self.is_leader
            if not ok or time.monotonic() - self._last_renew > self.s.renew_deadline_seconds:
                self.is_leader = False
                raise LeadershipLost(
                    f"could not renew Lease {self.s.lease_namespace}/{self.s.lease_name} "
                    f"within {self.s.renew_deadline_seconds}s"
                )

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby need not wait out its duration."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self.kube.get_lease(self.s.lease_namespace, self.s.lease_name)
            if lease is None or lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.renew_time = None
            lease.spec.acquire_time = None
            lease.spec.lease_duration_seconds = 1
            await self.kube.replace_lease(self.s.lease_namespace, lease)
            log.info("released the lease", extra={"action": "leader_released"})
        except KubeError as e:
            log.warning("could not release the lease", extra={"error": str(e)})
