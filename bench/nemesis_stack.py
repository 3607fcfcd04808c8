"""The nemesis' stack: real services and the platform's processes, each one restartable as a
supervisor would restart it, and a network namespace to cut one worker off.

Services are the tests' own (:mod:`tests.services`): tansu (Kafka protocol), etcd and mosquitto.
The platform runs as ``ffdl up`` processes of chosen roles, as in production: three of the
``workers`` role (job owners, reactors with the local launcher, monitors; each also a ``notifier``),
two ``scheduler`` candidates (one leads, under election in etcd), and two API replicas of
``api,projector``, each with its own data directory and projection file, as API pods would have.

The partition: when this process may make network namespaces (root, iproute2), the services
listen on the host end of a veth pair and the last worker runs inside the namespace at its other
end (its learners with it). Setting the namespace's end down cuts that worker and its learners off
from the broker and etcd at once, while everyone else still reaches them; setting it up heals. Where
a namespace cannot be made, the services listen on loopback and the cut is a SIGSTOP of the worker
(:attr:`Partition.available` says which, and the report says so).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ffdl.adapters.tenants import TenantRegistry
from ffdl.wiring.config import KafkaConfig, NodeConfig, SchedulerConfig, Settings
from tests.harness import fast_settings, settings_environment
from tests.services import EtcdServer, MosquittoServer, TansuBroker, free_port, wait_until_async

#: Tenants of the workload, and the admin who cordons and drains nodes.
TENANTS = ("acme", "globex")
ADMIN = "ops"
NODES = [NodeConfig(name=f"node-{n}", gpus=2) for n in "abc"]
WORKERS = 3
SCHEDULERS = 2
REPLICAS = ("a", "b")
#: Lease TTL of learners' heartbeats (seconds): etcd pauses are drawn shorter and longer than it.
HEARTBEAT_TTL_S = 3.0


class Partition:
    """A network namespace joined to the host by a veth pair, for one worker to be cut off in."""

    def __init__(self) -> None:
        tag = os.getpid() % 200 + 20
        self.namespace = f"ffdl-nemesis-{os.getpid()}"
        self._host_end = f"fnm{tag}h"
        self._inner_end = f"fnm{tag}n"
        self.host_ip = f"10.213.{tag}.1"
        self._inner_ip = f"10.213.{tag}.2"
        self.available = False
        self.why_not = ""

    def make(self) -> bool:
        """Create the namespace and the veth pair; False (with :attr:`why_not`) where it cannot."""
        inner = ["ip", "netns", "exec", self.namespace, "ip"]
        steps = [
            ["ip", "netns", "add", self.namespace],
            ["ip", "link", "add", self._host_end, "type", "veth", "peer", "name", self._inner_end],
            ["ip", "link", "set", self._inner_end, "netns", self.namespace],
            ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self._host_end],
            ["ip", "link", "set", self._host_end, "up"],
            [*inner, "addr", "add", f"{self._inner_ip}/30", "dev", self._inner_end],
            [*inner, "link", "set", self._inner_end, "up"],
            [*inner, "link", "set", "lo", "up"],
        ]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            stderr = getattr(exc, "stderr", b"") or b""
            self.why_not = f"{exc} {stderr.decode(errors='replace').strip()}".strip()
            self.remove()
            return False
        self.available = True
        return True

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace]

    def _inner_link(self, state: str) -> None:
        subprocess.run([*self.prefix(), "ip", "link", "set", self._inner_end, state], check=True, timeout=10)

    def cut(self) -> None:
        self._inner_link("down")

    def heal(self) -> None:
        self._inner_link("up")

    def remove(self) -> None:
        """Delete the namespace (its veth end, and so the pair, with it)."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=10, check=False)
        subprocess.run(["ip", "link", "del", self._host_end], capture_output=True, timeout=10, check=False)


@dataclass
class PlatformProcess:
    """One ``ffdl up`` process of some roles, started again after a kill as a supervisor would."""

    name: str
    roles: str
    env: dict[str, str]
    log: Path
    prefix: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    frozen: bool = False
    #: Killed by the nemesis: not to be started again before this (monotonic) time; 0: not killed.
    down_until: float = 0.0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "ffdl.cli", "up", "--roles", self.roles],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process is not None and self.alive:
            self.process.kill()
            self.process.wait()

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.alive:
            self.process.send_signal(sig)
            self.frozen = sig is signal.SIGSTOP

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (SIGKILL after ``timeout_s``), as an orderly shutdown."""
        if self.process is None or not self.alive:
            return
        if self.frozen:
            self.signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Stack:
    """The services and the platform's processes under ``root``; :meth:`stop` ends everything."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.partition = Partition()
        self.etcd = EtcdServer()
        self.broker = TansuBroker()
        self.mqtt = MosquittoServer()
        self.processes: dict[str, PlatformProcess] = {}
        self.tokens: dict[str, str] = {}
        self.api_urls: dict[str, str] = {}
        self.settings: Settings | None = None
        self.replica_settings: dict[str, Settings] = {}

    def start_services(self) -> None:
        host = self.partition.host_ip if self.partition.make() else "127.0.0.1"
        for service in (self.etcd, self.broker, self.mqtt):
            service.host = host
            service.start()

    def configure(self) -> Settings:
        """The platform's settings (the workers' and schedulers'), and each API replica's."""
        tenants_file = self.root / "tenants.json"
        registry = TenantRegistry(tenants_file)
        for tenant in TENANTS:
            self.tokens[tenant] = registry.add(tenant)
        self.tokens[ADMIN] = registry.add(ADMIN, admin=True)
        common = {
            "bus": self.broker.url,
            "heartbeats": self.etcd.url,
            "mqtt": self.mqtt.url,
            "topic_prefix": f"nemesis-{os.getpid()}",
            "partitions": 4,
            "nodes": NODES,
            "tenants_file": tenants_file,
            "api_workers": 1,
            "heartbeat_ttl_s": HEARTBEAT_TTL_S,
            "monitor_grace_s": 2 * HEARTBEAT_TTL_S,
            "leader_ttl_s": 3.0,
            "launch_timeout_s": 40.0,
            "kafka": KafkaConfig(session_timeout_s=6.0, heartbeat_interval_s=1.0),
            "scheduler": SchedulerConfig(min_runtime_s=5.0),
            "log_format": "json",
        }
        self.settings = fast_settings(self.root / "platform", **common)
        for replica in REPLICAS:
            url = f"http://127.0.0.1:{free_port()}"
            self.api_urls[replica] = url
            self.replica_settings[replica] = fast_settings(self.root / f"api-{replica}", api=url, **common)
        return self.settings

    def start_platform(self) -> None:
        assert self.settings is not None
        base = {**os.environ, **settings_environment(self.settings)}
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        for n in range(WORKERS):
            cut_off = n == WORKERS - 1 and self.partition.available
            self._add(f"worker-{n}", "workers,notifier", base, self.partition.prefix() if cut_off else [])
        for n in range(SCHEDULERS):
            self._add(f"scheduler-{n}", "scheduler", base, [])
        for replica, settings in self.replica_settings.items():
            self._add(f"api-{replica}", "api,projector", {**os.environ, **settings_environment(settings)}, [])
        for process in self.processes.values():
            process.start()

    def _add(self, name: str, roles: str, env: dict[str, str], prefix: list[str]) -> None:
        log = self.root / "logs" / f"{name}.log"
        self.processes[name] = PlatformProcess(name, roles, env, log, prefix)

    @property
    def cut_worker(self) -> PlatformProcess:
        """The worker that a partition cuts off (in the namespace, or frozen where there is none)."""
        return self.processes[f"worker-{WORKERS - 1}"]

    async def ready(self, timeout_s: float) -> None:
        """Return once every API replica is ready and a scheduler has recorded the nodes."""
        async with httpx.AsyncClient(timeout=5) as client:
            for url in self.api_urls.values():

                async def nodes_known(url: str = url) -> bool:
                    try:
                        ready = await client.get(f"{url}/readyz")
                        listed = await client.get(f"{url}/v1/nodes", headers=self.auth(ADMIN))
                    except httpx.TransportError:
                        return False
                    return ready.status_code == 200 and len(listed.json().get("nodes", [])) == len(NODES)

                await wait_until_async(nodes_known, timeout_s, interval_s=0.5, what=f"the API at {url}")

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}

    def restart_dead(self) -> None:
        """Start again every platform process that is not running (the end of the faults)."""
        for process in self.processes.values():
            if not process.alive:
                process.down_until = 0.0
                process.start()

    def stop_platform(self, names: list[str] | None = None) -> None:
        for name in names or list(self.processes):
            self.processes[name].stop()

    def stop(self) -> None:
        """End every process and service and remove the namespace; safe to call twice."""
        for process in self.processes.values():
            process.stop(timeout_s=10)
        if self.partition.available:
            self.partition.heal()
        for service in (self.mqtt, self.broker, self.etcd):
            service.stop()
        if self.partition.available:
            self.partition.remove()
            self.partition.available = False


def learner_processes() -> dict[int, tuple[str, bool]]:
    """Every learner process on this machine: pid → (job id, whether it is the agent).

    Found by the ``FFDL_JOB_ID`` in their environment, which the launcher gives the agent and the
    agent hands to the command; the agent is the one running ``ffdl.learner.agent``."""
    found: dict[int, tuple[str, bool]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        job = next((v[len(b"FFDL_JOB_ID=") :] for v in environ if v.startswith(b"FFDL_JOB_ID=")), None)
        if job and b"sh\0-c" not in cmdline:
            found[int(entry.name)] = (job.decode(), b"ffdl.learner.agent" in cmdline)
    return found
