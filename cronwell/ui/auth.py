"""The dashboard's cluster authentication and authorisation (`cronwell ui --auth kubernetes`).

Why the API server: the people who may see a namespace's ScheduledJobs are already written
down in the cluster's RBAC, so the dashboard asks it instead of keeping users of its own. A
bearer token is checked with a TokenReview, each permission with a SubjectAccessReview for
the token's user (the dashboard's own ServiceAccount needs only `create` on those two).

Answers are cached for a short TTL (a page asks about several namespaces; a refresh every
5 s must not cost an API call each): a token by its SHA-256, never the token itself; a
permission by the user and the question. A revoked token or RoleBinding is honoured within
the TTL. Both caches are bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cronwell import kubejson
from cronwell.models import GROUP

RESOURCE = "scheduledjobs"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
#: Longest token accepted (a JWT is ~1 KiB; an OIDC one with many groups a few KiB).
MAX_TOKEN_LENGTH = 16384

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReviewUnavailable(Exception):
    """The API server could not answer a review (unreachable, or refused the dashboard's
    own credentials): the request cannot be decided, which is not the user's fault."""


@dataclass(frozen=True, slots=True)
class User:
    """Who a TokenReview says the token belongs to: what a SubjectAccessReview is about."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class TtlCache(Generic[K, V]):
    """At most `size` entries, each forgotten `ttl` seconds after it was put; the oldest
    goes first when full."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.size, self.clock = ttl, size, clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self.clock():
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self.clock() + self.ttl, value)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class KubeAuth:
    """TokenReview and SubjectAccessReview against the cluster's API server, cached.

    The kubernetes client is synchronous: calls run on a small thread pool of their own, so a
    slow API server never blocks the event loop nor the default executor."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        audience: str | None = None,
        ttl_seconds: float = 30,
        cache_size: int = 4096,
        threads: int = 8,
    ) -> None:
        self.api = api
        self.audience = audience
        self.tokens: TtlCache[bytes, User] = TtlCache(ttl_seconds, cache_size)
        self.decisions: TtlCache[tuple[User, str, str], bool] = TtlCache(ttl_seconds, cache_size)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ui-auth")
        self._threads = threads

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()  # type: ignore[no-untyped-call]

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            return kubejson.request(self.api, "POST", path, body=body)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except ApiException as e:
            raise ReviewUnavailable(
                f"{path}: HTTP {e.status} {kubejson.api_message(e) or e.reason}"
            ) from None
        except (HTTPError, OSError) as e:
            raise ReviewUnavailable(f"{path}: {type(e).__name__}: {e}") from None

    async def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server does not authenticate it (or, with
        an audience, not for this dashboard). Only positive answers are cached."""
        digest = hashlib.sha256(token.encode()).digest()
        if (user := self.tokens.get(digest)) is not None:
            return user
        spec: dict[str, Any] = {"token": token}
        if self.audience:
            spec["audiences"] = [self.audience]
        review = await self._post(
            TOKEN_REVIEWS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        if self.audience and self.audience not in (status.get("audiences") or []):
            return None
        info = status.get("user") or {}
        extra = info.get("extra") or {}
        user = User(
            name=str(info.get("username", "")),
            uid=str(info.get("uid", "")),
            groups=tuple(str(g) for g in info.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(map(str, v))) for k, v in extra.items())),
        )
        if not user.name:
            return None
        self.tokens.put(digest, user)
        return user

    async def allowed(self, user: User, verb: str, namespace: str) -> bool:
        """Whether `user` may `verb` scheduledjobs (cronwell.dev) in `namespace` ("": in every
        namespace, a cluster-wide grant)."""
        key = (user, verb, namespace)
        if (cached := self.decisions.get(key)) is not None:
            return cached
        attributes = {"group": GROUP, "resource": RESOURCE, "verb": verb}
        if namespace:
            attributes["namespace"] = namespace
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": attributes,
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = await self._post(
            ACCESS_REVIEWS,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        allowed = bool((review.get("status") or {}).get("allowed"))
        self.decisions.put(key, allowed)
        return allowed

    async def namespaces(self, user: User, candidates: list[str], verb: str) -> list[str]:
        """The `candidates` where `user` may `verb` scheduledjobs: all of them on a
        cluster-wide grant (one review), else one review per namespace, a few at a time."""
        if await self.allowed(user, verb, ""):
            return list(candidates)
        gate = asyncio.Semaphore(self._threads)

        async def one(namespace: str) -> bool:
            async with gate:
                return await self.allowed(user, verb, namespace)

        verdicts = await asyncio.gather(*(one(ns) for ns in candidates))
        return [ns for ns, ok in zip(candidates, verdicts, strict=True) if ok]
