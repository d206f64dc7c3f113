"""Egress policy of http targets: which destinations a tenant's job may make the workers call.

A ScheduledJob borrows the workers' network position, so an http target is a server-side
request forgery waiting to happen (the cloud metadata service, loopback ports, the
Kubernetes API server). The policy is checked twice: at admission on the URL as written
(a literal IP or a host name: the webhook and `cronwell apply`), and in the worker at
connect time on every address the name resolves to (`cronwell_worker.egress`), so neither
DNS rebinding nor a redirect gets around it.

Order of the rules, first match wins:
1. the cluster's deny lists (`CRONWELL_EGRESS_DENY_CIDRS` / `_DENY_HOSTS`);
2. a namespace's deny list (annotation `cronwell.dev/egress-deny`);
3. the built-in deny list (link-local and cloud metadata, loopback, unspecified, the API
   server's names and service IP), unless the cluster's allow lists name the destination;
4. a namespace's allow list (annotation `cronwell.dev/egress-allow`): when set, only
   what it names; a namespace can only tighten, never open a built-in or cluster denial;
5. otherwise allowed.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cronwell.errors import CronwellError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_ANNOTATION = "cronwell.dev/egress-allow"
DENY_ANNOTATION = "cronwell.dev/egress-deny"

# (CIDR, what it is) — denied unless the cluster's allow list names them.
BUILTIN_CIDRS: tuple[tuple[str, str], ...] = (
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("fe80::/10", "link-local (cloud metadata)"),
    ("fd00:ec2::254/128", "the AWS metadata service"),
    ("100.100.100.200/32", "the Alibaba Cloud metadata service"),
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("0.0.0.0/8", "unspecified"),
    ("::/128", "unspecified"),
)
BUILTIN_HOSTS: tuple[tuple[str, str], ...] = (
    ("metadata", "a cloud metadata host name"),
    ("metadata.google.internal", "a cloud metadata host name"),
    ("metadata.goog", "a cloud metadata host name"),
    ("instance-data", "a cloud metadata host name"),
    ("instance-data.ec2.internal", "a cloud metadata host name"),
    ("localhost", "loopback"),
    ("localhost.localdomain", "loopback"),
    ("*.localhost", "loopback"),
    ("kubernetes", "the Kubernetes API server"),
    ("kubernetes.default", "the Kubernetes API server"),
    ("kubernetes.default.svc", "the Kubernetes API server"),
    ("kubernetes.default.svc.*", "the Kubernetes API server"),
)


class EgressDenied(CronwellError):
    """A destination the egress policy refuses; the message names the rule and the fix."""


def normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def parse_ip(host: str) -> IPAddress | None:
    """`host` as an IP address, including the legacy IPv4 forms a resolver accepts
    (`2130706433`, `0x7f.1`, `127.1`) and IPv4-mapped IPv6; None for a host name."""
    h = normalize_host(host).strip("[]")
    try:
        ip: IPAddress = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        if not h or not all(c in "0123456789abcdefx." for c in h) or not h[0].isdigit():
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded(ip: IPAddress | None) -> list[IPAddress]:
    """IPv4 addresses an IPv6 address carries (6to4, Teredo, NAT64), which a network may
    route to: checked against the built-in list like the address itself."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    out: list[IPAddress] = []
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out += list(ip.teredo)
    if ip in _NAT64:
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


@dataclass(frozen=True)
class Rules:
    """CIDRs (matched against addresses) and host patterns (`*.corp`, matched against
    names), each with what it is for messages."""

    cidrs: tuple[tuple[IPNetwork, str], ...] = ()
    hosts: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str], what: str, *, source: str) -> Rules:
        """CIDRs, IPs and host patterns mixed (a setting or an annotation)."""
        cidrs: list[tuple[IPNetwork, str]] = []
        hosts: list[tuple[str, str]] = []
        for raw in entries:
            entry = normalize_host(raw)
            if not entry:
                continue
            if any(c.isdigit() for c in entry[:1]) or ":" in entry:
                try:
                    cidrs.append((ipaddress.ip_network(entry, strict=False), what))
                    continue
                except ValueError:
                    if "/" in entry or ":" in entry:
                        raise EgressDenied(
                            f"{source}: {raw!r} is neither a CIDR (10.0.0.0/8, fd00::/8) nor a "
                            "host pattern (api.example.com, *.corp): fix the entry"
                        ) from None
            hosts.append((entry, what))
        return cls(tuple(cidrs), tuple(hosts))

    def match_ip(self, ip: IPAddress) -> tuple[str, str] | None:
        for net, what in self.cidrs:
            if ip.version == net.version and ip in net:
                return str(net), what
        return None

    def match_host(self, host: str) -> tuple[str, str] | None:
        for pattern, what in self.hosts:
            if fnmatch.fnmatchcase(host, pattern):
                return pattern, what
        return None

    def match(self, host: str | None, ip: IPAddress | None) -> tuple[str, str] | None:
        return (self.match_host(host) if host else None) or (self.match_ip(ip) if ip else None)


def split_list(value: str) -> list[str]:
    """A comma- or whitespace-separated list (annotations, environment variables)."""
    return [p for p in value.replace(",", " ").split() if p]


def _builtin(extra_api_server: str | None) -> Rules:
    rules = Rules(tuple((ipaddress.ip_network(c), w) for c, w in BUILTIN_CIDRS), BUILTIN_HOSTS)
    if extra_api_server:
        api = "the Kubernetes API server (KUBERNETES_SERVICE_HOST)"
        ip = parse_ip(extra_api_server)
        if ip is not None:
            rules = Rules((*rules.cidrs, (ipaddress.ip_network(ip), api)), rules.hosts)
        else:
            rules = Rules(rules.cidrs, (*rules.hosts, (normalize_host(extra_api_server), api)))
    return rules


@dataclass(frozen=True)
class NamespaceEgress:
    """A namespace's tightening, from its annotations (kept in the store for the workers)."""

    namespace: str
    allow: Rules | None = None
    deny: Rules = field(default_factory=Rules)

    @classmethod
    def from_annotations(cls, namespace: str, annotations: Mapping[str, str]) -> NamespaceEgress:
        allow_raw = annotations.get(ALLOW_ANNOTATION)
        deny_raw = annotations.get(DENY_ANNOTATION, "")
        src = f"namespace {namespace}"
        return cls(
            namespace,
            Rules.parse(split_list(allow_raw), "allowed", source=f"{src} {ALLOW_ANNOTATION}")
            if allow_raw is not None
            else None,
            Rules.parse(split_list(deny_raw), "denied", source=f"{src} {DENY_ANNOTATION}"),
        )


@dataclass(frozen=True)
class EgressPolicy:
    """The cluster's policy (settings) plus, optionally, one namespace's tightening."""

    builtin: Rules
    allow: Rules = field(default_factory=Rules)
    deny: Rules = field(default_factory=Rules)
    namespace: NamespaceEgress | None = None

    @classmethod
    def from_lists(
        cls,
        *,
        allow_cidrs: Iterable[str] = (),
        allow_hosts: Iterable[str] = (),
        deny_cidrs: Iterable[str] = (),
        deny_hosts: Iterable[str] = (),
        api_server_host: str | None = None,
    ) -> EgressPolicy:
        """The cluster policy; `api_server_host` defaults to KUBERNETES_SERVICE_HOST."""
        src = "the egress settings (CRONWELL_EGRESS_*)"
        api = (
            api_server_host
            if api_server_host is not None
            else os.environ.get("KUBERNETES_SERVICE_HOST")
        )
        return cls(
            builtin=_builtin(api),
            allow=Rules.parse([*allow_cidrs, *allow_hosts], "allowed", source=src),
            deny=Rules.parse([*deny_cidrs, *deny_hosts], "denied", source=src),
        )

    def for_namespace(self, ns: NamespaceEgress | None) -> EgressPolicy:
        return EgressPolicy(self.builtin, self.allow, self.deny, ns)

    def check(self, host: str | None, ip: IPAddress | None, *, target: str) -> None:
        """Raise EgressDenied when the destination (`host` as written, `ip` it is or
        resolved to; either may be None) is refused. `target` names it in the message."""
        host = normalize_host(host) if host else None
        hit = self.deny.match(host, ip)
        if hit:
            raise EgressDenied(
                f"{target} is denied by the cluster's egress deny list ({hit[0]}): use "
                "another destination, or ask a cluster admin to change "
                "egress.denyCidrs/denyHosts (CRONWELL_EGRESS_DENY_CIDRS/_HOSTS)"
            )
        ns = self.namespace
        if ns is not None:
            hit = ns.deny.match(host, ip)
            if hit:
                raise EgressDenied(
                    f"{target} is denied by namespace {ns.namespace}'s {DENY_ANNOTATION} "
                    f"annotation ({hit[0]}): use another destination, or ask the namespace's "
                    "admin to change the annotation"
                )
        for value in (host, ip, *_embedded(ip)):
            if value is None:
                continue
            if isinstance(value, str):
                hit, allowed = self.builtin.match_host(value), self.allow.match_host(value)
            else:
                hit, allowed = self.builtin.match_ip(value), self.allow.match_ip(value)
            if hit and not allowed:
                raise EgressDenied(
                    f"{target} is {hit[1]} ({hit[0]}), which workers never call on a "
                    "tenant's behalf by default: use another destination, or, if this one "
                    "is intended, have a cluster admin allow it with egress.allowCidrs/"
                    "allowHosts (CRONWELL_EGRESS_ALLOW_CIDRS/_HOSTS)"
                )
        if ns is not None and ns.allow is not None:
            listed = ns.allow.match(host, ip)
            undecidable = ip is None and ns.allow.cidrs  # a name, before resolution
            if not listed and not undecidable:
                names = ", ".join(
                    [str(n) for n, _ in ns.allow.cidrs] + [h for h, _ in ns.allow.hosts]
                )
                raise EgressDenied(
                    f"{target} is not in namespace {ns.namespace}'s {ALLOW_ANNOTATION} "
                    f"annotation ({names or 'empty: nothing is allowed'}): use a listed "
                    "destination, or ask the namespace's admin to add it"
                )

    def check_url(self, url: str, *, field_name: str = "spec.target.http.url") -> None:
        """The admission check: the URL's host as written (a literal IP or a name)."""
        try:
            host = urlsplit(url).hostname or ""
        except ValueError as e:
            raise EgressDenied(f"{field_name}: {url!r} is not a valid URL ({e})") from None
        if not host:
            raise EgressDenied(f"{field_name}: {url!r} has no host: write http(s)://HOST/PATH")
        ip = parse_ip(host)
        self.check(None if ip is not None else host, ip, target=f"{field_name}: host {host!r}")
