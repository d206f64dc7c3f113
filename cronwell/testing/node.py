"""One real Kubernetes node for e2e tests: a control plane plus a kubelet and containerd.

Why: with only an API server no Pod ever starts, so the image, the probes, the read-only
root filesystem, the migration hook and the in-cluster configuration go untested. This
harness runs, on this host and without Docker: etcd, kube-apiserver (``ControlPlane``),
kube-controller-manager, kube-scheduler, a kubelet and a private containerd (Debian's
containerd, runc and CNI plugins; binaries from ``hack/envtest.sh --node``).

Isolation, so that the host is left as it was found:

- Network: the kubelet, containerd and so every Pod live in a network namespace the
  harness creates, joined to the host by a veth pair (host side: the API server, and the
  test's own servers such as PostgreSQL; node side: the node IP). That namespace has no
  default route: the node reaches the harness's addresses and nothing else, so an image
  pull cannot leave the machine; the harness also fails loudly if one was attempted.
  By default there is no kube-proxy: one DNAT rule sends the ``kubernetes`` Service to
  the API server, and the API server reaches webhooks by endpoint
  (``--enable-aggregator-routing``). ``Node(services=True)`` adds Services as a cluster has
  them: kube-proxy (iptables mode, in the node's namespace, masquerading Service traffic
  since pods share a bridge without br_netfilter) and a cluster DNS on the host side of the
  veth (cronwell/testing/dns.py: Service names to ClusterIPs) that the kubelet gives pods.
- Mounts: the kubelet and containerd share a private mount namespace (held by a
  ``sleep``), with a fresh /run and private /var/log and /var/lib/cni, so pod volumes,
  rootfs mounts, netns files and shim sockets vanish with it.
- Cgroups: pods go under a cgroup root of their own, removed at the end.
- Sysctls the kubelet sets (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops)
  and net.ipv4.ip_forward are saved and restored.

Teardown runs on stop(), at exit, on SIGTERM/SIGHUP, and for a crashed run at the next
start or with ``python -m cronwell.testing.node down`` (each run's directory records what
it created in state.json and is locked while its owner lives).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import yaml

from cronwell.testing.controlplane import (
    ADMIN_USER,
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlane,
    ControlPlaneError,
    LocalCluster,
    _spawn,
    _stop,
    _tail,
    find_assets,
    free_port,
    owned,
    sweep_stale_dirs,
    write_kubeconfig,
)
from cronwell.testing.dns import CLUSTER_DOMAIN, ServiceDNS, ServiceLookup
from cronwell.testing.oci import image_name

NODE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kubectl",
    "kubelet",
    "kube-controller-manager",
    "kube-scheduler",
)
PAUSE_ARCHIVE = "pause.tar"
#: Needed only by ``Node(services=True)``.
KUBE_PROXY = "kube-proxy"
PROXY_USER = "system:kube-proxy"
DIR_PREFIX = "cronwell-node-"
NODE_NAME = "cronwell-node"
#: Host side of the veth: 10.213.<k>.1/30, node side .2; pods get 10.214.<k>.0/24.
LINK_NET = "10.213.{k}.0/30"
POD_NET = "10.214.{k}.0/24"
KUBERNETES_SERVICE_IP = str(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)[1])
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward")
#: Directories masked in the node's mount namespace; created (and later removed) if absent.
MASKED_DIRS = ("/var/log", "/var/lib/cni", "/var/lib/kubelet")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NODE_HINT = (
    "run `bash hack/envtest.sh --node` to build the node's binaries and `make sysdeps` "
    "for containerd, runc and the CNI plugins"
)
#: Lines of containerd's log that mean an image was pulled or about to be.
_PULL_LOG = re.compile(r"PullImage|trying next host|fetch failed")


class NodeError(ControlPlaneError):
    """The node could not be provided, did not become Ready, or tried to pull an image."""


def _run(*argv: str, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, input=input)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def _cgroup_dirs(root: str) -> list[Path]:
    """The directories of ``root`` in every mounted hierarchy (v1 and, on hybrid hosts,
    the v2 "unified" one where runc mirrors the v1 tree)."""
    hierarchies = sorted(CGROUP_ROOT.iterdir())
    return [h / root.strip("/") for h in hierarchies if (h / "cgroup.procs").exists()]


def _pids_under(directory: Path) -> set[int]:
    pids: set[int] = set()
    for procs in directory.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def _mnt_ns(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running or exiting; a zombie (exited, waiting for its parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _processes_of(state: dict[str, Any]) -> set[int]:
    """Live processes of a run: in its cgroups, its mount namespace, or naming its dir."""
    pids: set[int] = set()
    for directory in _cgroup_dirs(state["cgroup_root"]):
        pids |= _pids_under(directory)
    mnt, marker = state.get("mnt_ns"), state["dir"].encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        if mnt is not None and _mnt_ns(proc.name) == mnt:
            pids.add(int(proc.name))
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "cmdline").read_bytes():
                pids.add(int(proc.name))
    return pids


def teardown(state: dict[str, Any]) -> list[str]:
    """Undo everything a run recorded in its state; returns what could not be undone.

    Safe to call twice and on a half-started run: each step checks what exists.
    """
    problems: list[str] = []
    killed: set[int] = set()
    for _ in range(50):  # containers may fork while dying; shims reap them
        pids = _processes_of(state)
        if not pids:
            break
        _kill_all(pids)
        killed |= pids
        time.sleep(0.1)
    else:
        problems.append(f"processes still alive: {sorted(_processes_of(state))}")
    deadline = time.monotonic() + 10
    while (dying := [pid for pid in killed if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # a SIGKILLed process is gone only once its exit completes
    if dying:
        problems.append(f"processes not exiting: {sorted(dying)}")
    for directory in _cgroup_dirs(state["cgroup_root"]):
        if directory.exists():
            for sub in sorted(directory.rglob("*"), key=lambda p: -len(p.parts)):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            try:
                directory.rmdir()
            except OSError as exc:
                problems.append(f"cgroup {directory}: {exc}")
    if (netns := state.get("netns")) and Path(f"/run/netns/{netns}").exists():
        _run("ip", "netns", "delete", netns, check=False)
    if veth := state.get("veth"):  # normally gone with the namespace
        _run("ip", "link", "delete", veth, check=False)
    for name, value in state.get("sysctls", {}).items():
        try:
            if _sysctl_path(name).read_text().strip() != value:
                _sysctl_path(name).write_text(value)
        except OSError as exc:
            problems.append(f"sysctl {name}: {exc}")
    others = [d for d in _node_dirs() if str(d) != state["dir"] and owned(d)]
    for created in state.get("created_dirs", []):
        if not others:
            with contextlib.suppress(OSError):
                Path(created).rmdir()
    return problems


def _node_dirs() -> list[Path]:
    return sorted(p for p in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*") if p.is_dir())


def sweep(verbose: bool = False) -> int:
    """Tear down every run whose owner is gone (crashed, SIGKILLed); returns how many."""
    swept = 0
    for directory in _node_dirs():
        # No owner.lock yet: a harness is starting (it locks before renaming the file).
        if not (directory / "owner.lock").exists() or owned(directory):
            continue
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((directory / "state.json").read_text())
            problems = teardown(state)
            if verbose:
                print(f"node: cleaned {directory}", *problems, sep="\n  ", file=sys.stderr)
        shutil.rmtree(directory, ignore_errors=True)
        swept += 1
    return swept


def _free_link_index() -> int:
    """A k such that 10.213.k.0/30 and 10.214.k.0/24 are on no interface or route."""
    used = _run("ip", "-o", "-4", "addr") + _run("ip", "-4", "route")
    for k in range(1, 255):
        if f"10.213.{k}." not in used and f"10.214.{k}." not in used:
            return k
    raise NodeError("no free 10.213.k.0/30 link network (255 nodes running?)")


class Node(LocalCluster):
    """A one-node cluster; use as a context manager. ``start_seconds``: nothing → Ready.

    ``images`` are image archives (OCI or docker) imported into the node's containerd
    before the kubelet starts; the pause image is always imported. ``services``: run
    kube-proxy and a cluster DNS, so that pods reach Services by ClusterIP and by name.
    """

    def __init__(
        self,
        assets: Path | str | None = None,
        *,
        images: Sequence[Path | str] = (),
        start_timeout: float = 180,
        services: bool = False,
    ) -> None:
        binaries = (*NODE_BINARIES, KUBE_PROXY) if services else NODE_BINARIES
        self.assets = Path(assets) if assets is not None else find_assets(binaries)
        missing = [n for n in (*binaries, PAUSE_ARCHIVE) if not (self.assets / n).is_file()]
        if missing:
            raise NodeError(f"{', '.join(missing)} missing in {self.assets}: {NODE_HINT}")
        for tool in ("containerd", "ctr", "runc", "nsenter", "unshare", "iptables", "ip"):
            if shutil.which(tool) is None:
                raise NodeError(f"{tool} is not installed: {NODE_HINT}")
        if not Path("/usr/lib/cni/bridge").exists():
            raise NodeError(f"/usr/lib/cni/bridge is not installed: {NODE_HINT}")
        if os.geteuid() != 0:
            raise NodeError("a node needs root (network namespaces, mounts, cgroups)")
        super().__init__(Path("/nonexistent"), self.assets / "kubectl")
        self.images = [Path(p) for p in images]
        self.services = services
        self.dns: ServiceDNS | None = None
        self.start_timeout = start_timeout
        self.start_seconds: float | None = None
        self.node_name = NODE_NAME
        self.host_ip = self.node_ip = self.pod_cidr = ""
        self.dir: Path | None = None
        self.plane: ControlPlane | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.state: dict[str, Any] = {}
        self._lock: IO[bytes] | None = None
        self._old_handlers: dict[int, Any] = {}
        self._node_kubeconfig = Path("/nonexistent")  # the kubelet's, once the plane runs
        self._proxy_kubeconfig = Path("/nonexistent")  # kube-proxy's (services=True)

    # -- lifecycle

    def start(self) -> None:
        """Bring the node up and return once it is Ready; on any failure, tear down."""
        if self.dir is not None:
            raise NodeError("already started")
        atexit.register(self.stop)
        for sig in (signal.SIGTERM, signal.SIGHUP):  # run atexit/finally, not just die
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    def _save_state(self) -> None:
        assert self.dir is not None
        (self.dir / "state.json").write_text(json.dumps(self.state, indent=1))

    def _start(self) -> None:
        sweep()
        started = time.monotonic()
        self.dir = self._make_dir(DIR_PREFIX)
        run_id = self.dir.name.removeprefix(DIR_PREFIX)
        self.state = {
            "dir": str(self.dir),
            "cgroup_root": f"/{DIR_PREFIX}{run_id}",
            "sysctls": {n: _sysctl_path(n).read_text().strip() for n in SYSCTLS},
        }
        self._save_state()
        self._network(run_id)
        self._control_plane()
        self._cgroups()
        self._mount_namespace()
        self._containerd()
        if self.services:
            self._service_proxy()
        self._kubelet()
        self._wait_node_ready()
        self.start_seconds = time.monotonic() - started

    def _network(self, run_id: str) -> None:
        with open(Path(tempfile.gettempdir()) / "cronwell-node.net.lock", "wb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two harnesses must not pick the same k
            k = _free_link_index()
            link = ipaddress.ip_network(LINK_NET.format(k=k))
            self.host_ip, self.node_ip = str(link[1]), str(link[2])
            self.pod_cidr = POD_NET.format(k=k)
            netns, veth, peer = f"{DIR_PREFIX}{run_id}", f"cwn{k}h", f"cwn{k}n"
            self.state |= {"netns": netns, "veth": veth}
            self._save_state()
            _run("ip", "netns", "add", netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", netns)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", veth)
            _run("ip", "link", "set", veth, "up")
        inside = ("ip", "netns", "exec", netns)
        _run(*inside, "ip", "addr", "add", f"{self.node_ip}/30", "dev", peer)
        _run(*inside, "ip", "link", "set", peer, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        # The API server and tests reach pods (webhooks, /metrics) through the node.
        _run("ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", veth)

    def _control_plane(self) -> None:
        assert self.dir is not None
        node_user = f"system:node:{self.node_name}"
        self.plane = ControlPlane(
            self.assets,
            address=self.host_ip,
            alt_names=[
                f"IP:{KUBERNETES_SERVICE_IP}",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ],
            users={
                node_user: "system:nodes",
                "system:kube-controller-manager": "system:kube-controller-manager",
                "system:kube-scheduler": "system:kube-scheduler",
                # Bound to system:node-proxier by the API server's bootstrap policy.
                **({PROXY_USER: "system:node-proxiers"} if self.services else {}),
            },
            extra_apiserver_args={
                # A real cluster's defaults: ServiceAccount admission mounts the token
                # that in-cluster clients use; kubelets are authorized as nodes.
                "disable-admission-plugins": "",
                "enable-admission-plugins": "NodeRestriction",
                "authorization-mode": "Node,RBAC",
                # No kube-proxy on the host: reach webhook Services through endpoints.
                "enable-aggregator-routing": "true",
                # Reach the kubelet (logs, exec) at its IP: its name is in no DNS.
                "kubelet-preferred-address-types": "InternalIP",
            },
        )
        self.plane.start()
        self.kubeconfig = self.plane.kubeconfig
        self._kubectl_env = self.plane._kubectl_env
        ca = self.plane.ca_file.read_bytes()
        kubeconfigs = {}
        for user in self.plane.user_groups:
            if user == ADMIN_USER:
                continue
            path = self.dir / f"{user.split(':')[-1]}.kubeconfig"
            write_kubeconfig(path, self.plane.server, self.plane.user_tokens[user], ca)
            kubeconfigs[user] = path
        # Pods reach the API server as `kubernetes.default` (10.0.0.1:443), like kube-proxy would.
        port = self.plane.server.rsplit(":", 1)[1]
        _run(
            *("ip", "netns", "exec", self.state["netns"], "iptables", "-t", "nat", "-A"),
            *("PREROUTING", "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443"),
            *("-j", "DNAT", "--to-destination", f"{self.host_ip}:{port}"),
        )
        pki = self.plane.ca_file.parent
        self._spawn_control_component(
            "kube-controller-manager",
            kubeconfigs["system:kube-controller-manager"],
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--cert-dir={self.dir / 'kcm-certs'}",
        )
        self._spawn_control_component(
            "kube-scheduler",
            kubeconfigs["system:kube-scheduler"],
            f"--cert-dir={self.dir / 'scheduler-certs'}",
        )
        self._node_kubeconfig = kubeconfigs[node_user]
        self._proxy_kubeconfig = kubeconfigs.get(PROXY_USER, Path("/nonexistent"))

    def _spawn_control_component(self, name: str, kubeconfig: Path, *extra: str) -> None:
        """kube-controller-manager or kube-scheduler: one replica, no leader election, a
        loopback-only secure port, its own kubeconfig for everything it authenticates."""
        assert self.dir is not None
        self.processes[name] = _spawn(
            [
                str(self.assets / name),
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--v=1",
                f"--secure-port={free_port()}",
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                *extra,
            ],
            self.dir / f"{name}.log",
        )

    def _cgroups(self) -> None:
        """The pods' cgroup root in every hierarchy (cpuset needs its cpus/mems copied)."""
        for directory in _cgroup_dirs(self.state["cgroup_root"]):
            directory.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (directory / name).exists():
                    (directory / name).write_text((directory.parent / name).read_text())

    def _mount_namespace(self) -> None:
        assert self.dir is not None
        created = []
        binds = []
        for target in MASKED_DIRS:
            if not Path(target).exists():
                Path(target).mkdir(parents=True)
                created.append(target)
            source = self.dir / "mnt" / target.strip("/").replace("/", "-")
            source.mkdir(parents=True)
            binds.append(f"mount --bind {source} {target}")
        self.state["created_dirs"] = created
        self._save_state()
        ready = self.dir / "mnt" / "ready"
        script = "set -e; mount -t tmpfs -o mode=755 tmpfs /run; "
        script += "; ".join(binds) + f"; touch {ready}; exec sleep infinity"
        self.processes["mount-namespace"] = _spawn(
            ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script],
            self.dir / "mount-namespace.log",
        )
        self._wait(lambda: ready.exists(), "the node's mount namespace", "mount-namespace")
        self.state["mnt_ns"] = _mnt_ns(self.processes["mount-namespace"].pid)
        self._save_state()

    def _enter(self) -> list[str]:
        """Argv prefix running a command in the node's mount and network namespaces."""
        holder = self.processes["mount-namespace"].pid
        return [
            "nsenter",
            f"--mount=/proc/{holder}/ns/mnt",
            f"--net=/run/netns/{self.state['netns']}",
            "--",
        ]

    @property
    def containerd_socket(self) -> Path:
        assert self.dir is not None
        return self.dir / "containerd.sock"

    def pause_image(self) -> str:
        """The pause image's name, read from the archive's index."""
        return image_name(self.assets / PAUSE_ARCHIVE)

    def _containerd(self) -> None:
        assert self.dir is not None
        cni = self.dir / "cni"
        cni.mkdir()
        (cni / "10-cronwell.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": self.state["netns"],
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.pod_cidr}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.dir / "cni-ipam"),
                            },
                        }
                    ],
                }
            )
        )
        root = self.dir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{root}/ttrpc.sock"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[{cri}]
  sandbox_image = "{self.pause_image()}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni}"
  max_conf_num = 1
[{cri}.registry]
  config_path = "{root}/certs.d"
"""
        (self.dir / "containerd.toml").write_text(config)
        # Every registry is "mirrored" to a closed local port, and the node's network
        # namespace has no route out anyway: a pull fails at once, and loudly.
        hosts = root / "certs.d" / "_default"
        hosts.mkdir(parents=True)
        (hosts / "hosts.toml").write_text(
            'server = "https://127.0.0.1:1"\n[host."https://127.0.0.1:1"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
        self.processes["containerd"] = _spawn(
            [*self._enter(), "containerd", f"--config={self.dir / 'containerd.toml'}"],
            self.dir / "containerd.log",
        )
        self._wait(self.containerd_socket.exists, "containerd's socket", "containerd")
        for archive in [self.assets / PAUSE_ARCHIVE, *self.images]:
            self.import_image(archive)

    def ctr(self, *args: str) -> str:
        """Run ``ctr`` against the node's containerd, in the k8s.io namespace."""
        return _run("ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args)

    def import_image(self, archive: Path | str) -> None:
        """Load an image archive into the node (what `kind load image-archive` does)."""
        if not Path(archive).is_file():
            raise NodeError(f"image archive {archive} does not exist")
        self.ctr("images", "import", str(archive))

    def _service_proxy(self) -> None:
        """kube-proxy in the node's namespaces and the cluster DNS on the host side."""
        assert self.dir is not None and self.plane is not None
        lookup = ServiceLookup(self.plane.server, self.plane.token, self.plane.ca_file)
        try:
            self.dns = ServiceDNS(lookup, self.host_ip)
        except OSError as exc:  # a DNS server of the host's own, bound to every address
            raise NodeError(f"the cluster DNS cannot listen on {self.host_ip}:53: {exc}") from exc
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self._proxy_kubeconfig)},
            "hostnameOverride": self.node_name,
            "mode": "iptables",
            "clusterCIDR": self.pod_cidr,
            "detectLocalMode": "ClusterCIDR",
            # Pods share a bridge and the host may lack br_netfilter: a Service's reply from
            # a pod on the same bridge must come back through the node to be un-NATed.
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # Zeros leave the host's conntrack sysctls (global, not per namespace) alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
            # The node's own loopback (its network namespace): no clash with the host.
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
        }
        (self.dir / "kube-proxy.yaml").write_text(yaml.safe_dump(config))
        self.processes["kube-proxy"] = _spawn(
            [
                *self._enter(),
                str(self.assets / KUBE_PROXY),
                f"--config={self.dir / 'kube-proxy.yaml'}",
                "--v=1",
            ],
            self.dir / "kube-proxy.log",
        )

    def _kubelet(self) -> None:
        assert self.dir is not None
        root = self.dir / "kubelet"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.state["cgroup_root"],
            "failCgroupV1": False,
            "failSwapOn": False,
            "address": self.node_ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # Only the API server (over the veth) can reach the kubelet.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "/etc/resolv.conf",
            # The disk is shared with other work: never evict or GC our imported images.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
        }
        if self.dns is not None:
            config |= {"clusterDNS": [self.host_ip], "clusterDomain": CLUSTER_DOMAIN}
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self.processes["kubelet"] = _spawn(
            [
                *self._enter(),
                str(self.assets / "kubelet"),
                f"--config={self.dir / 'kubelet.yaml'}",
                f"--kubeconfig={self._node_kubeconfig}",
                f"--root-dir={root}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_ip}",
                "--v=2",
            ],
            self.dir / "kubelet.log",
        )

    def _wait(self, ready: Any, what: str, *watch: str) -> None:
        """Poll ``ready()`` until true; fail with the log of a watched process that died."""
        assert self.dir is not None
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            for name in watch or self.processes:
                proc = self.processes[name]
                if proc.poll() is not None:
                    raise NodeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}:\n"
                        + _tail(self.dir / f"{name}.log")
                    )
            if time.monotonic() > deadline:
                raise NodeError(f"no {what} after {self.start_timeout}s: {NODE_HINT}")
            time.sleep(0.2)

    def _node_ready(self) -> bool:
        out = self.kubectl(
            "get",
            "node",
            self.node_name,
            "--ignore-not-found",
            "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            check=False,
        )
        return out.stdout.strip() == "True"

    def _wait_node_ready(self) -> None:
        assert self.dir is not None
        try:
            self._wait(self._node_ready, f"Ready node {self.node_name}")
        except NodeError as exc:
            raise NodeError(f"{exc}\nkubelet log:\n{_tail(self.dir / 'kubelet.log', 40)}") from None
        # Pods in "default" need its ServiceAccount (made by the controller-manager).
        self._wait(
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            "default ServiceAccount",
        )

    # -- checks

    def pull_attempts(self, allowed: str | None = None) -> list[str]:
        """Evidence of image pulls: Pulling events and containerd's pull log lines.

        Lines mentioning ``allowed`` (a test's deliberate, local pull) are left out.
        """
        found: list[str] = []
        events = self.kubectl(
            *("get", "events", "-A", "--field-selector=reason=Pulling", "-o"),
            "jsonpath={range .items[*]}{.involvedObject.name}: {.message}{'\\n'}{end}",
            check=False,
        )
        found += [line for line in events.stdout.splitlines() if line.strip()]
        if self.dir is not None and (log := self.dir / "containerd.log").exists():
            text = log.read_text(errors="replace")
            found += [line for line in text.splitlines() if _PULL_LOG.search(line)]
        return [line for line in found if allowed is None or allowed not in line]

    def assert_no_pulls(self, allowed: str | None = None) -> None:
        """Fail loudly if anything tried to pull an image (nothing may reach a registry)."""
        if found := self.pull_attempts(allowed):
            raise NodeError("image pull attempted on the node:\n" + "\n".join(found[:20]))

    def host_sysctls_restored(self) -> dict[str, tuple[str, str]]:
        """After stop(): sysctls that differ from what start() saw (expected: none)."""
        return {
            name: (value, _sysctl_path(name).read_text().strip())
            for name, value in self.state.get("sysctls", {}).items()
            if _sysctl_path(name).read_text().strip() != value
        }

    def logs(self) -> Iterator[tuple[str, Path]]:
        """The node's component logs (for a failing test's report)."""
        if self.dir is not None:
            for log in sorted(self.dir.glob("*.log")):
                yield log.stem, log

    def stop(self) -> None:
        """Stop everything and undo every host change. Idempotent."""
        atexit.unregister(self.stop)
        try:
            for name in ("kubelet", "containerd"):  # the rest goes in teardown()
                if (proc := self.processes.get(name)) is not None:
                    _stop(proc, 10)
        finally:
            try:
                for proc in self.processes.values():
                    _stop(proc, 0)
                self.processes.clear()
                if self.state and (problems := teardown(self.state)):
                    print("node: teardown left:", *problems, sep="\n  ", file=sys.stderr)
            finally:
                if self.dns is not None:
                    self.dns.stop()
                    self.dns = None
                if self.plane is not None:
                    self.plane.stop()
                    self.plane = None
                self._remove_dir()
                for sig, handler in self._old_handlers.items():
                    signal.signal(sig, handler)
                self._old_handlers.clear()


def main(argv: Sequence[str] | None = None) -> int:
    """``up``: a node until Ctrl-C (prints KUBECONFIG); ``down``: clean up crashed runs."""
    parser = argparse.ArgumentParser(prog="python -m cronwell.testing.node")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a node and keep it until Ctrl-C")
    up.add_argument("--image", action="append", default=[], help="image archive to import")
    up.add_argument(
        "--services", action="store_true", help="Services: run kube-proxy and a cluster DNS"
    )
    sub.add_parser("down", help="tear down what crashed runs left behind")
    args = parser.parse_args(argv)
    if args.command == "down":
        swept = sweep(verbose=True)
        sweep_stale_dirs()  # the control planes of those runs
        live = [d for d in _node_dirs() if owned(d)]
        print(f"node: cleaned {swept} run(s); {len(live)} running", file=sys.stderr)
        return 0
    # Ctrl-C must stop it even when started with SIGINT ignored (a shell's background job,
    # nohup): Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Node(images=args.image, services=args.services) as node:
            print(f"node Ready in {node.start_seconds:.1f}s", file=sys.stderr)
            print(f"export KUBECONFIG={node.kubeconfig}")
            print(f"# node dir: {node.dir} (`make node-down` cleans it after a crash)")
            print(f"# pods reach this host at {node.host_ip}; Ctrl-C stops", file=sys.stderr)
            sys.stdout.flush()
            signal.pause()
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
