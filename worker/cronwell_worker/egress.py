"""The egress policy at connect time: an httpx client whose every TCP connection resolves
the host itself, checks each address against the policy and connects to a checked address
(Host header and TLS SNI keep the name, so certificates still verify).

Checking here rather than on the URL closes the two ways around an admission check: DNS
rebinding (a name that resolved to a public address at admission and to 169.254.169.254
now) and redirects (each hop to a new origin opens a new connection, checked again).
Environment proxies are ignored (`trust_env=False`): through a proxy the worker would
check the proxy's address, not the destination's.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from cronwell.egress import EgressPolicy, IPAddress, parse_ip

MAX_REDIRECTS = 5
"""Hops followed for a target with followRedirects (each one checked)."""


class Backend(httpcore.AsyncNetworkBackend):
    """Resolve, check every address, connect to a checked one."""

    def __init__(self, policy: EgressPolicy):
        self.policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def _resolve(self, host: str, port: int, timeout: float | None) -> list[IPAddress]:
        literal = parse_ip(host)
        if literal is not None:
            return [literal]
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as e:
            raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from e
        found: list[IPAddress] = []
        for info in infos:
            ip = parse_ip(str(info[4][0]))
            if ip is not None and ip not in found:
                found.append(ip)
        if not found:
            raise httpcore.ConnectError(f"{host} resolved to no address")
        return found

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        ips = await self._resolve(host, port, timeout)
        name = None if parse_ip(host) is not None else host
        # Every answer is checked, not only the one used: a mixed answer is refused whole.
        for ip in ips:
            where = f"{host}:{port}" + (f" (resolved to {ip})" if name else "")
            self.policy.check(name, ip, target=where)
        error: Exception | None = None
        for ip in ips:
            try:
                return await self._inner.connect_tcp(
                    str(ip), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                error = e
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not an http target")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def client(policy: EgressPolicy, *, verify: bool = True) -> httpx.AsyncClient:
    """An httpx client whose connections obey `policy` (redirects off unless a request asks)."""
    transport = httpx.AsyncHTTPTransport(verify=verify, trust_env=False)
    ctx: ssl.SSLContext = httpx.create_ssl_context(verify=verify, trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(  # the one seam httpx has for this
        ssl_context=ctx,
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=Backend(policy),
    )
    return httpx.AsyncClient(
        transport=transport, follow_redirects=False, max_redirects=MAX_REDIRECTS, trust_env=False
    )
