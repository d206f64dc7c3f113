"""A minimal cluster DNS for the node harness: Service names to ClusterIPs.

Why: pods of some workloads (CloudNativePG's instances and cronwell pointed at them) name
their database by Service, ``<service>`` or ``<service>.<namespace>[.svc.cluster.local]``,
and the node runs no CoreDNS (no image may be pulled). The kubelet gives every pod this
server as its nameserver (``clusterDNS``) and the usual search path
(``<ns>.svc.cluster.local svc.cluster.local cluster.local``).

What it answers, over UDP, from the API server (a Service is looked up when asked and
remembered for ``ttl`` seconds):

- ``A <service>.<namespace>.svc.<domain>``: the Service's ClusterIP (TTL ``ttl``);
- the same name with another type (AAAA for one): no data, so resolvers do not give up;
- anything else: NXDOMAIN. Nothing is forwarded: the node has no way out anyway.

Standard library only; one thread; stopped with ``stop()``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"
_A, _ANY, _IN = 1, 255, 1
_NOERROR, _FORMERR, _NXDOMAIN, _NOTIMP = 0, 1, 3, 4


def _parse_question(packet: bytes) -> tuple[int, int, str, int, int] | None:
    """(id, flags, qname, qtype, end offset of the question) of a one-question query."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        return None
    labels, offset = [], 12
    while True:
        if offset >= len(packet):
            return None
        length = packet[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0:  # no compression in a question we accept
            return None
        labels.append(packet[offset : offset + length].decode("ascii", "replace"))
        offset += length
    if offset + 4 > len(packet):
        return None
    qtype, qclass = struct.unpack("!HH", packet[offset : offset + 4])
    del qclass
    return ident, flags, ".".join(labels).lower(), qtype, offset + 4


def answer(packet: bytes, resolve: Callable[[str], str | None], ttl: int = 5) -> bytes | None:
    """The response to a query ``packet`` (None: not worth answering). ``resolve`` maps a
    name to its IPv4 address, "" (exists, no address) or None (no such name)."""
    parsed = _parse_question(packet)
    if parsed is None:
        if len(packet) < 12:
            return None
        ident = struct.unpack("!H", packet[:2])[0]
        return struct.pack("!HHHHHH", ident, 0x8000 | _FORMERR, 0, 0, 0, 0)
    ident, flags, qname, qtype, end = parsed
    question = packet[12:end]
    opcode = (flags >> 11) & 0xF
    # QR, the query's opcode and RD echoed, RA set (we answer recursively for our zone).
    base_flags = 0x8000 | (opcode << 11) | (flags & 0x0100) | 0x0080
    if opcode != 0:
        return struct.pack("!HHHHHH", ident, base_flags | _NOTIMP, 1, 0, 0, 0) + question
    address = resolve(qname)
    if address is None:
        return struct.pack("!HHHHHH", ident, base_flags | _NXDOMAIN, 1, 0, 0, 0) + question
    if qtype not in (_A, _ANY) or not address:
        return struct.pack("!HHHHHH", ident, base_flags | _NOERROR, 1, 0, 0, 0) + question
    record = struct.pack("!HHHIH", 0xC00C, _A, _IN, ttl, 4) + socket.inet_aton(address)
    return struct.pack("!HHHHHH", ident, base_flags | 0x0400, 1, 1, 0, 0) + question + record


class ServiceLookup:
    """``<service>.<namespace>.svc.<domain>`` → ClusterIP, from the API server.

    ``resolve`` returns the address, "" for a Service without one (headless) or a name
    that exists only as a prefix of the zone, or None for a name that does not exist.
    """

    def __init__(
        self, server: str, token: str, ca_file: Path, domain: str = CLUSTER_DOMAIN, ttl: float = 2
    ) -> None:
        self.server, self.token, self.domain, self.ttl = server, token, domain, ttl
        self.ca_file = ca_file
        self._context: ssl.SSLContext | None = None
        self._cache: dict[tuple[str, str], tuple[float, str | None]] = {}

    def resolve(self, qname: str) -> str | None:
        zone = f"svc.{self.domain}"
        is_namespace = qname.endswith("." + zone) and qname.count(".") == zone.count(".") + 1
        if qname in (zone, self.domain) or is_namespace:
            return ""  # the zone itself or a namespace: exists, holds no address
        if not qname.endswith("." + zone):
            return None
        parts = qname.removesuffix("." + zone).split(".")
        if len(parts) != 2:
            return None
        name, namespace = parts
        now = time.monotonic()
        cached = self._cache.get((namespace, name))
        if cached is not None and cached[0] > now:
            return cached[1]
        address = self._fetch(namespace, name)
        self._cache[(namespace, name)] = (now + self.ttl, address)
        return address

    def _fetch(self, namespace: str, name: str) -> str | None:
        request = urllib.request.Request(
            f"{self.server}/api/v1/namespaces/{namespace}/services/{name}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        try:
            if self._context is None:
                self._context = ssl.create_default_context(cafile=str(self.ca_file))
            with urllib.request.urlopen(request, timeout=2, context=self._context) as resp:
                service = json.load(resp)
        except urllib.error.HTTPError as exc:
            return None if exc.code == 404 else ""
        except (OSError, ValueError):
            return ""  # the API server is busy: no data now, not "no such name"
        ip = service.get("spec", {}).get("clusterIP") or ""
        return "" if ip == "None" else ip


class ServiceDNS:
    """Serve ``lookup`` on UDP ``address:port`` from a daemon thread until ``stop()``."""

    def __init__(self, lookup: ServiceLookup, address: str, port: int = 53) -> None:
        self.lookup = lookup
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()
        self.queries = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                packet, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1
            with contextlib.suppress(Exception):  # one bad query must not stop the server
                if (response := answer(packet, self.lookup.resolve)) is not None:
                    self.sock.sendto(response, peer)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self.sock.close()
