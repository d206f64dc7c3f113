"""Test HTTP servers (ledgers, hooks) that take a burst's connections at once."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BurstServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with a listen backlog for a burst. The standard library's is 5:
    when 100 workers connect in the same instant, the kernel drops the connections the
    accept queue cannot hold and the clients retry their SYN 1, 3, 7 and 15 s later, so a
    ledger measured its own accept queue as start lag (tests/node/test_prescale.py saw
    groups of occurrences exactly 1, 7 and 15 s late)."""

    request_queue_size = 1024
    daemon_threads = True


def serve(address: str, handler: type[BaseHTTPRequestHandler]) -> BurstServer:
    """A BurstServer on an ephemeral port of `address`, serving from a daemon thread."""
    server = BurstServer((address, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
