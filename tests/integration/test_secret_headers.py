"""The worker's half of Secret-backed headers, against a real store and HTTP server: it
decrypts the values the operator stored (cronwell_job_secrets, written here by the same
store function), sends them, reads them again for each attempt (rotation), and keeps them out
of every error it records. The operator's half (reading the Secret) is in
tests/e2e/test_secrets.py."""

from __future__ import annotations

import uuid

from cryptography.fernet import Fernet

from cronwell.secretbox import SecretBox
from cronwell.store import job_secrets
from cronwell.store.db import Database
from tests.helpers.http import serve
from tests.helpers.wait import wait_for

from .helpers import make_job, sql
from .worker_helpers import (
    FAR_FUTURE,
    http_server,
    occurrence,
    running_worker,
    state_is,
    trigger,
)

HEADERS = [
    {"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
    {"name": "X-Plain", "value": "plain"},
]


async def _store(db: Database, box: SecretBox, job_id: uuid.UUID, value: str) -> None:
    values = {"Authorization": value}
    await job_secrets.upsert(
        db, job_id=job_id, ciphertext=box.encrypt(values), digest=box.digest(values)
    )


async def test_values_are_decrypted_per_attempt_and_redacted_from_errors(
    db: Database, db_url: str
) -> None:
    box = SecretBox(Fernet.generate_key().decode())
    v1, v2 = "Bearer first-4f1c9a", "Bearer second-77d0e2"
    with http_server([200, 200, 401]) as srv:
        job = await make_job(
            db, "api", schedule=FAR_FUTURE,
            target={"http": {"url": srv.url, "headers": HEADERS}},
            retry={"maxAttempts": 1},
        )  # fmt: skip
        await _store(db, box, job.id, v1)
        async with running_worker(db_url, secrets=box):
            k1 = await trigger(db, "api")
            await wait_for(lambda: state_is(db, k1, "succeeded"), 60)
            await _store(db, box, job.id, v2)  # the operator saw the rotated Secret
            k2 = await trigger(db, "api")
            await wait_for(lambda: state_is(db, k2, "succeeded"), 60)
            # The server answers 401 echoing the credential: the recorded error hides it.
            k3 = await trigger(db, "api")
            await wait_for(lambda: state_is(db, k3, "dead"), 60)
    got = [{k.lower(): v for k, v in r.headers.items()} for r in srv.requests]
    assert [h["authorization"] for h in got] == [v1, v2, v2]
    assert all(h["x-plain"] == "plain" for h in got)
    # The store holds the values encrypted only.
    dump = await sql(
        db,
        "SELECT string_agg(t::text, ' ') AS s FROM (SELECT * FROM cronwell_job_secrets) t",
    )
    assert v1 not in dump[0]["s"] and v2 not in dump[0]["s"]
    o = await occurrence(db, k3)
    assert o["reason"] == "HTTP401"


async def test_an_echoed_credential_is_redacted(db: Database, db_url: str) -> None:
    """A server that puts the request's Authorization into its error answer."""
    from http.server import BaseHTTPRequestHandler
    from typing import Any

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = f"bad token {self.headers.get('Authorization')}".encode()
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = serve("127.0.0.1", Echo)
    box = SecretBox(Fernet.generate_key().decode())
    secret = "Bearer echoed-9b3e11"
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        job = await make_job(
            db, "echo", schedule=FAR_FUTURE, target={"http": {"url": url, "headers": HEADERS}},
            retry={"maxAttempts": 1},
        )  # fmt: skip
        await _store(db, box, job.id, secret)
        async with running_worker(db_url, secrets=box):
            key = await trigger(db, "echo")
            o = await wait_for(lambda: state_is(db, key, "dead"), 60)
    finally:
        server.shutdown()
        server.server_close()
    assert o["last_error"].endswith("answered 403: bad token ***"), o["last_error"]
    rows = await sql(db, "SELECT error FROM cronwell_attempts WHERE idempotency_key = %s", key)
    assert rows and all(secret.split()[1] not in (r["error"] or "") for r in rows)


async def test_no_stored_value_or_no_key_sends_nothing(db: Database, db_url: str) -> None:
    with http_server() as srv:
        await make_job(
            db, "unresolved", schedule=FAR_FUTURE,
            target={"http": {"url": srv.url, "headers": HEADERS}}, retry={"maxAttempts": 1},
        )  # fmt: skip
        async with running_worker(db_url):
            key = await trigger(db, "unresolved")
            o = await wait_for(lambda: state_is(db, key, "dead"), 60)
    assert o["reason"] in ("SecretUnresolved", "AttemptsExhausted"), o
    assert "its Secret has not been resolved" in o["last_error"]
    assert srv.requests == []
