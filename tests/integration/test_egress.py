"""The egress policy at connect time, with a real worker, real sockets and real HTTP servers:
a refused destination is a non-retryable failure with reason EgressDenied (nothing sent,
counted in metrics); the check runs after DNS resolution and on every redirect hop."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from cronwell.egress import EgressPolicy
from cronwell.store.db import Database
from tests.helpers.http import serve
from tests.helpers.wait import wait_for

from .helpers import make_job
from .worker_helpers import (
    FAR_FUTURE,
    LOCAL_EGRESS,
    http_server,
    occurrence,
    running_worker,
    state_is,
    trigger,
)


@contextlib.contextmanager
def redirector(address: str, location: str) -> Iterator[tuple[str, list[str]]]:
    """A server on `address` answering every request with 302 to `location`."""
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        def _any(self) -> None:
            seen.append(self.path)
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = serve(address, H)
    try:
        yield f"http://{address}:{server.server_address[1]}/start", seen
    finally:
        server.shutdown()
        server.server_close()


async def _dead(db: Database, key: str) -> dict[str, Any]:
    return await wait_for(lambda: state_is(db, key, "dead"), 60)


def _denied(w: Any) -> float:
    v = w.worker.metrics.registry.get_sample_value(
        "cronwell_policy_denied_total", {"pool": "default", "reason": "EgressDenied"}
    )
    return float(v or 0)


async def test_the_default_policy_refuses_loopback_and_counts_it(db: Database, db_url: str) -> None:
    with http_server() as srv:
        await make_job(
            db,
            "loop",
            schedule=FAR_FUTURE,
            target={"http": {"url": srv.url}},
            retry={"maxAttempts": 3, "initialDelaySeconds": 0},
        )
        async with running_worker(db_url, egress=EgressPolicy.from_lists()) as w:
            key = await trigger(db, "loop")
            o = await _dead(db, key)
            assert _denied(w) == 1
    assert (o["reason"], o["attempt"]) == ("EgressDenied", 1)  # not retried
    assert "is loopback (127.0.0.0/8)" in o["last_error"]
    assert "egress.allowCidrs" in o["last_error"]  # the fix
    assert srv.requests == []  # nothing reached the server


async def test_a_name_is_checked_after_resolution(db: Database, db_url: str) -> None:
    """An allowed name (what admission saw) that resolves to a denied address is refused at
    connect time: the same path as DNS rebinding."""
    with http_server() as srv:
        url = srv.url.replace("127.0.0.1", "localhost")
        await make_job(db, "byname", schedule=FAR_FUTURE, target={"http": {"url": url}})
        policy = EgressPolicy.from_lists(allow_hosts=["localhost"])
        policy.check_url(url)  # passes admission: the name is allowed
        async with running_worker(db_url, egress=policy):
            o = await _dead(db, await trigger(db, "byname"))
    assert o["reason"] == "EgressDenied", o
    assert "(resolved to 127.0.0.1) is loopback" in o["last_error"]
    assert srv.requests == []


async def test_redirects_are_off_by_default_and_every_hop_is_checked(
    db: Database, db_url: str
) -> None:
    with (
        http_server() as inside,
        http_server() as outside,
    ):
        # 127.0.0.2 is loopback too, and outside the one address the policy allows.
        forbidden = outside.url  # served on 127.0.0.1; reached below through 127.0.0.2
        with (
            redirector("127.0.0.1", forbidden.replace("127.0.0.1", "127.0.0.2")) as (bad, _),
            redirector("127.0.0.1", inside.url) as (good, _),
        ):
            for name, url, follow in (
                ("off", good, False),
                ("hop-denied", bad, True),
                ("hop-allowed", good, True),
            ):
                await make_job(
                    db,
                    name,
                    schedule=FAR_FUTURE,
                    target={"http": {"url": url, "followRedirects": follow}},
                )
            policy = EgressPolicy.from_lists(allow_cidrs=[LOCAL_EGRESS])
            async with running_worker(db_url, egress=policy) as w:
                off = await _dead(db, await trigger(db, "off"))
                denied = await _dead(db, await trigger(db, "hop-denied"))
                ok_key = await trigger(db, "hop-allowed")
                await wait_for(lambda: state_is(db, ok_key, "succeeded"), 60)
                assert _denied(w) == 1
    assert (off["reason"], off["attempt"]) == ("Redirect", 1)
    assert "not followed" in off["last_error"] and "followRedirects: true" in off["last_error"]
    assert (denied["reason"], denied["attempt"]) == ("EgressDenied", 1)
    assert "127.0.0.2" in denied["last_error"] and "loopback" in denied["last_error"]
    assert outside.requests == []
    assert len(inside.requests) == 1  # only the allowed hop's target
    assert (await occurrence(db, ok_key))["attempt"] == 1
