"""The node harness's cluster DNS (cronwell/testing/dns.py): queries built byte by byte,
answers read back; a real UDP round trip through ServiceDNS."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from cronwell.testing.dns import ServiceDNS, ServiceLookup, answer

NAMES = {"pg-rw.db.svc.cluster.local": "10.0.0.7", "headless.db.svc.cluster.local": ""}


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def parse(response: bytes) -> tuple[int, int, int, bytes]:
    """(id, rcode, answer count, the answer's address or b"")."""
    ident, flags, _, ancount = struct.unpack("!HHHH", response[:8])
    return ident, flags & 0xF, ancount, response[-4:] if ancount else b""


def test_a_record_for_a_service() -> None:
    ident, rcode, count, address = parse(
        answer(query("pg-rw.db.svc.cluster.local"), NAMES.get) or b""
    )
    assert (ident, rcode, count) == (0x1234, 0, 1)
    assert socket.inet_ntoa(address) == "10.0.0.7"


def test_other_types_and_headless_services_have_no_data_but_exist() -> None:
    for name, qtype in (("pg-rw.db.svc.cluster.local", 28), ("headless.db.svc.cluster.local", 1)):
        assert parse(answer(query(name, qtype), NAMES.get) or b"")[1:3] == (0, 0)


def test_unknown_names_are_nxdomain_and_garbage_formerr() -> None:
    assert parse(answer(query("example.com"), NAMES.get) or b"")[1] == 3
    assert parse(answer(b"\x12\x34" + b"\0" * 10, NAMES.get) or b"")[1] == 1
    assert answer(b"\x01", NAMES.get) is None


def test_service_names_are_split_into_name_and_namespace() -> None:
    lookup = ServiceLookup("https://127.0.0.1:1", "token", Path("/nonexistent"), ttl=60)
    # Not a Service name: answered without asking the API server.
    assert lookup.resolve("db.svc.cluster.local") == ""
    assert lookup.resolve("a.b.c.svc.cluster.local") is None
    assert lookup.resolve("example.com") is None
    # The API server is unreachable: "no data now", never "no such name".
    assert lookup.resolve("pg-rw.db.svc.cluster.local") == ""


def test_udp_round_trip() -> None:
    lookup = ServiceLookup("https://127.0.0.1:1", "token", Path("/nonexistent"))
    lookup.resolve = NAMES.get  # type: ignore[method-assign]
    server = ServiceDNS(lookup, "127.0.0.1", port=0)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(5)
            client.sendto(query("pg-rw.db.svc.cluster.local", ident=7), server.address)
            ident, rcode, count, address = parse(client.recv(512))
        assert (ident, rcode, count, socket.inet_ntoa(address)) == (7, 0, 1, "10.0.0.7")
    finally:
        server.stop()
