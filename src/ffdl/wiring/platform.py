"""Wiring: builds the adapters the settings name and runs the platform's roles in one process.

Roles (``ffdl up --roles``): ``workers`` (the job owners on the commands topic and the reactor
host with the monitor on the events topic), ``scheduler`` (under leader election), ``projector``
(the read models), ``notifier`` (MQTT status out and telemetry in, when ``FFDL_MQTT`` is set) and
``api`` (served by the CLI's ``up``; its process also counts the dead-letter topic for the
metrics). Consumer groups are named after the topic prefix, so platforms sharing a Kafka cluster
never share one; the projector's group is also named after its projection file's replica id, so
each API replica with a projection of its own folds every partition into it. Each role runs under
a supervisor that restarts it after a crash with backoff (the shortest delay again once a role ran
for :data:`HEALTHY_RUN_S`); a restarted role refolds its partitions first.
``FFDL_LAUNCHER=instant`` learners complete at once (benchmarks and scale tests).
Singleton roles are elected through etcd when ``FFDL_ELECTION`` (or, by default, the heartbeat
store) names an etcd, else through lock files in the data dir; the scheduler serves terms of
leadership (``handlers/leadership.py``).

Every command is sent for a principal (``ffdl.core.authorization``): each role's sender for its own
(the scheduler, or the platform role it is), the API's for its caller, the MQTT bridge's for the
tenant whose topic the telemetry came on. With ``direct_tenants`` the workers also run the ingress
relay (``handlers/ingress.py``): each named tenant's own commands topic, relayed for that tenant.

The scheduler leader records the inventory on the log (node events) from its source: the
configured nodes by default; with ``FFDL_LAUNCHER=kubernetes``, where learners are pods, the
cluster's nodes, kept current by a node watch. The workers then also watch their jobs' learner
pods (observations the agents cannot send) and remove the pods of jobs that should have none.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import structlog

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import open_election
from ffdl.adapters.heartbeats import EtcdJobUsers, open_job_logins, open_store
from ffdl.adapters.inventory import ConfiguredInventory
from ffdl.adapters.launchers.isolation import protect_data_dir
from ffdl.adapters.tenants import TenantRegistry
from ffdl.core.authorization import ANONYMOUS, SCHEDULER, Principal
from ffdl.core.kinds import aggregate_kinds
from ffdl.handlers.aio import Backoff, supervise
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.deadletters import DeadLetterTally
from ffdl.handlers.driver import Driver
from ffdl.handlers.ingress import IngressRelay
from ffdl.handlers.leadership import lead
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, Election, HeartbeatStore, InventorySource, Launcher
from ffdl.handlers.projector import Projector
from ffdl.handlers.reactor import ReactorHost
from ffdl.handlers.runtime import consume
from ffdl.handlers.scheduler import Scheduler
from ffdl.projections.store import Projection
from ffdl.wiring.config import Settings

if TYPE_CHECKING:
    from ffdl.adapters.launchers.kubernetes import KubernetesCluster

log = structlog.get_logger(__name__)

ALL_ROLES = frozenset({"api", "workers", "scheduler", "projector", "notifier"})
#: The longest pause before retrying the event log or restarting a crashed role.
RETRY_MAX_S = 10.0
#: A role that ran this long before it crashed was healthy: it is restarted after the shortest pause.
HEALTHY_RUN_S = 60.0


def open_launcher(
    settings: Settings, heartbeats: HeartbeatStore, logins: EtcdJobUsers | None = None
) -> Launcher:
    """The launcher ``settings.launcher`` names; the instant one reports through ``heartbeats``; the
    local one gives each job's agents a login of their own where the store authenticates."""
    if settings.launcher == "instant":
        from ffdl.adapters.launchers.instant import InstantLauncher  # noqa: PLC0415 - load only the chosen adapter

        return InstantLauncher(heartbeats, heartbeat_ttl_s=settings.heartbeat_ttl_s)
    from ffdl.adapters.launchers.local import LocalLauncher  # noqa: PLC0415
    from ffdl.adapters.launchers.sandbox import Sandbox  # noqa: PLC0415

    sandbox = None
    if settings.sandbox == "bwrap":
        protected = [settings.data_dir, settings.tenants_path, settings.work_dir]
        sandbox = Sandbox.for_this_interpreter(protected, network=settings.sandbox_network)
    return LocalLauncher(
        settings.work_dir,
        settings.heartbeats_url,
        heartbeat_ttl_s=settings.heartbeat_ttl_s,
        user=settings.learner_user,
        log_format=settings.log_format,
        logins=logins,
        sandbox=sandbox,
        data_roots=settings.data_roots,
        result_roots=settings.result_roots,
    )


@dataclass
class Platform:
    """Everything one ``ffdl up`` process runs; use ``async with Platform(settings) as p``."""

    settings: Settings
    roles: frozenset[str] = ALL_ROLES
    launcher: Launcher | None = None
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")

    def __post_init__(self) -> None:
        s = self.settings
        self.topics = Topics.with_prefix(s.topic_prefix)
        self.bus: Bus = open_bus(
            s.bus_url,
            s.partitions,
            kafka=s.kafka,
            topics=(
                self.topics.commands,
                self.topics.events,
                self.topics.deadletter,
                *(self.topics.ingress(tenant) for tenant in s.direct_tenants),
            ),
        )
        self.heartbeats: HeartbeatStore = open_store(s.heartbeats_url, s.etcd.credentials())
        self.election: Election = open_election(s.election_url, s.leader_ttl_s, s.etcd.credentials())
        #: Learners' own heartbeat logins, where the heartbeat store authenticates (etcd with auth).
        self.job_logins = open_job_logins(s.heartbeats_url, s.etcd.credentials())
        self.projection = Projection(s.projection_path)
        self.projector = Projector(self.bus, self.topics, self.projection)
        # The API sends each command for its caller; one sent for nobody in particular is refused.
        self.sender = CommandSender(self.bus, self.topics, f"api@{self.instance}", ANONYMOUS)
        #: The owners' consumer group: past its committed offset on the commands topic, every command
        #: has been decided and its events (if any) appended.
        self.owners_group = self._group("owners")
        self.inventory: InventorySource | None = None
        self.policy = s.restart_policy
        self.reactor: ReactorHost | None = None
        self.owner: JobOwner | None = None
        self.kubernetes: KubernetesCluster | None = None
        self.dead_letters = DeadLetterTally()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Platform:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        s = self.settings
        protect_data_dir(s.data_dir)
        await self._start_bus()
        if s.launcher == "kubernetes" and self.roles & {"workers", "scheduler"}:
            await self._start_kubernetes()
        if "workers" in self.roles:
            kubernetes_launcher = self.kubernetes.launcher if self.kubernetes is not None else None
            self.launcher = (
                self.launcher or kubernetes_launcher or open_launcher(s, self.heartbeats, self.job_logins)
            )
            ctx = ReactionContext(
                sender=self._role_sender("reactor"),
                launcher=self.launcher,
                learner_env={
                    "FFDL_HEARTBEATS": s.heartbeats_url,
                    "FFDL_HEARTBEAT_TTL": str(s.heartbeat_ttl_s),
                },
                stop_grace_s=s.stop_grace_s,
                job_dir=s.job_dir,
                result_roots=tuple(s.result_roots),
                checkpoints=s.checkpoint_places,
                heartbeats=self.heartbeats,
            )
            monitor = Monitor(
                self.heartbeats,
                self._role_sender("monitor"),
                heartbeat_ttl_s=s.heartbeat_ttl_s,
                grace_s=s.monitor_grace_s,
                launch_timeout_s=s.launch_timeout_s,
            )
            self.reactor = ReactorHost(self.bus, self.topics.events, Driver(ctx), [monitor])
            self.owner = JobOwner(
                self.bus,
                self.topics,
                self.election,
                producer=f"owner@{self.instance}",
                kinds=aggregate_kinds(self.policy, s.checkpoint_places),
                ceilings=TenantRegistry(s.tenants_path).max_priority,
            )
            owner, reactor = self.owner, self.reactor
            owners, reactors = self.owners_group, self._group("reactors")
            self._supervise(
                "owner",
                lambda: consume(self.bus, owners, [self.topics.commands], owner, self._stop, fenced=True),
            )
            self._supervise(
                "reactor", lambda: consume(self.bus, reactors, [self.topics.events], reactor, self._stop)
            )
            self._supervise("reconciler", lambda: reactor.reconcile_forever(self._stop))
            if s.direct_tenants:
                relay = IngressRelay(self.bus, self.topics, s.direct_tenants)
                relays = self._group("ingress")
                self._supervise(
                    "ingress", lambda: consume(self.bus, relays, relay.topics, relay, self._stop, fenced=True)
                )
            self._supervise("monitor", lambda: monitor.run(self._stop))
            if self.kubernetes is not None:
                kubernetes = self.kubernetes
                pod_sender = self._role_sender("pods")
                pods = kubernetes.pod_watcher(pod_sender, reactor.owns, self.heartbeats)
                self._supervise("pods", lambda: pods.run(self._stop))
                keeps = self._keeps_learners
                self._supervise("orphans", lambda: kubernetes.remove_orphans_forever(keeps, self._stop))
        if "scheduler" in self.roles:
            inventory = self.inventory = self.inventory or ConfiguredInventory(s.inventory())
            self._supervise(
                "scheduler",
                lambda: lead(self.election, SCHEDULER_ROLE, partial(self._schedule, inventory), self._stop),
            )
        if "notifier" in self.roles and s.mqtt:
            from ffdl.adapters.mqtt import MqttBridge  # noqa: PLC0415 - only with an MQTT broker configured

            mqtt_sender = CommandSender(self.bus, self.topics, f"mqtt@{self.instance}", ANONYMOUS)
            bridge = MqttBridge(s.mqtt, self.bus, self.topics, mqtt_sender, self._group("notifier"))
            self._supervise("notifier", lambda: bridge.run(self._stop))
        if "projector" in self.roles:
            projectors = self._group(f"projector.{self.projection.replica}")
            self._supervise(
                "projector",
                lambda: consume(
                    self.bus, projectors, [self.topics.events], self.projector, self._stop, max_records=2000
                ),
            )
        if "api" in self.roles:
            self._supervise(
                "dead-letters", lambda: self.dead_letters.follow(self.bus, self.topics.deadletter, self._stop)
            )
        log.info(
            "platform started",
            roles=sorted(self.roles),
            bus=s.bus_url,
            heartbeats=s.heartbeats_url,
            data_dir=str(s.data_dir.resolve()),
        )

    async def _start_kubernetes(self) -> None:
        """Learners are pods: the cluster's nodes are the inventory, kept current by a node watch."""
        from ffdl.adapters.launchers.kubernetes import KubernetesCluster  # noqa: PLC0415 - only for pods

        s = self.settings
        client = await KubernetesCluster.client_for(s.kube)
        self.kubernetes = kubernetes = KubernetesCluster(
            client,
            s.kube,
            heartbeats_url=s.heartbeats_url,
            heartbeat_ttl_s=s.heartbeat_ttl_s,
            stop_grace_s=s.stop_grace_s,
            logins=self.job_logins,
        )
        self.inventory = kubernetes.nodes
        self._supervise("nodes", lambda: kubernetes.nodes.run(self._stop))

    def _role_sender(self, role: str) -> CommandSender:
        """The sender of one of the platform's roles, for that role."""
        return CommandSender(self.bus, self.topics, f"{role}@{self.instance}", Principal.platform(role))

    def _keeps_learners(self, job_id: str) -> bool:
        """Whether a job may have learners now, or is another instance's to judge (orphan removal)."""
        reactor = self.reactor
        if reactor is None or self.bus.partition_for(job_id) not in reactor.partitions:
            return True
        job = reactor.book.jobs.get(job_id)
        return job is not None and job.state.holds_learners

    def _group(self, role: str) -> str:
        """The consumer group of a role, named after the topic prefix: platforms sharing a Kafka cluster
        (each with its own prefix) never share a group."""
        return f"{self.settings.topic_prefix}.{role}"

    async def _start_bus(self) -> None:
        backoff = Backoff(0.5, RETRY_MAX_S)
        while True:
            try:
                await self.bus.start()
                return
            except ConnectionError as exc:
                delay = backoff.next_delay()
                log.warning(
                    "event log unreachable; retrying",
                    bus=self.settings.bus_url,
                    error=str(exc),
                    retry_in_s=delay,
                )
                await asyncio.sleep(delay)

    async def _schedule(self, inventory: InventorySource, token: int) -> None:
        """The scheduler's work for the term ``token``: follow the events and plan; either failing ends it.

        Each term consumes in a consumer group of its own (named by its token): a leader that died
        without leaving its group still holds its claims there until its session expires, and the
        scheduler must see every partition from the start.
        """
        scheduler = Scheduler(
            self.bus,
            self.topics.events,
            CommandSender(self.bus, self.topics, f"scheduler@{self.instance}", SCHEDULER),
            inventory,
            token,
            policy=self.settings.scheduler_policy(),
        )
        group = self._group(f"scheduler.{token}")
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(consume(self.bus, group, [self.topics.events], scheduler, self._stop))
            tasks.create_task(scheduler.plan_forever(self._stop))

    def _supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run a role until the platform stops, restarted after a crash (see :func:`supervise`)."""
        backoff = Backoff(0.5, RETRY_MAX_S)
        supervised = supervise(name, run, self._stop, backoff=backoff, healthy_after_s=HEALTHY_RUN_S)
        self._tasks.append(asyncio.create_task(supervised, name=name))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.reactor is not None:
            await self.reactor.driver.close()
        if self.launcher is not None:
            await self.launcher.close()
        if self.kubernetes is not None:
            await self.kubernetes.close()
        await self.election.close()
        if self.job_logins is not None:
            await self.job_logins.close()
        await self.heartbeats.close()
        await self.bus.close()
        self.projection.close()
