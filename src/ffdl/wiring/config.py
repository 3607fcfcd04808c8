"""Configuration: one optional YAML file (``FFDL_CONFIG``) plus ``FFDL_*`` environment overrides.

The default is fully embedded: the log, the heartbeats and the projections live in files under
``data_dir``, learners are local processes, and the inventory is one node with 8 simulated GPUs
(or the real NVIDIA GPUs of this machine, when there are any).

Scheduling: ``tenant_quotas`` gives each named tenant its guaranteed GPUs, borrowing limit and
fair share weight (tenants not named, like the API's ``default``, are unlimited with weight 1);
``scheduler`` sets preemption, the minimum runtime before a job may be preempted, and how many
waiting jobs get nodes reserved. A node with ``schedulable: false`` is cordoned: its jobs run on,
nothing new is placed there.

The API is served by ``api_workers`` processes (one per usable CPU by default) sharing its port: the
projection file takes any number of readers. Bounds on what API callers may ask for:
``max_request_bytes`` per request body, ``max_followers`` open streams (events, logs) in all and
``max_followers_per_tenant`` per tenant (each API process admits its share), ``api_header_timeout_s``
for a connection to send a request's headers and ``api_max_connections`` open per process. A job's
``data_dir`` and ``result_dir`` are URIs the platform never opens (``s3://...``), paths relative
to the job's own directory, or absolute paths under ``data_roots`` / ``result_roots``
(``FFDL_DATA_ROOTS='["/data"]'``); with no roots configured no absolute path is accepted.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ffdl.adapters.bus.kafka_config import KafkaConfig
from ffdl.adapters.heartbeats.etcd_auth import EtcdConfig
from ffdl.adapters.launchers.k8s_manifests import CHECKPOINT_DIR
from ffdl.adapters.launchers.kube_config import KubeConfig
from ffdl.core.allocator import Node
from ffdl.core.places import JOB_ID_FIELD, CheckpointPlaces
from ffdl.core.restart import RestartPolicy
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.tenancy import TenancyPolicy, TenantQuota

#: API processes by default on a machine with many CPUs: each is a whole Python process with its own
#: connections, and a few already serve thousands of requests a second from one projection file.
MAX_DEFAULT_API_WORKERS = 8


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: those it may run on, fewer under a cgroup's CPU quota (a
    container's CPU limit, which the affinity does not show), rounded up."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
        if quota != "max":
            usable = min(usable, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota to read: the affinity it is
    return usable


class NodeConfig(BaseModel):
    name: str
    gpus: int = Field(default=8, ge=0)
    gpu_type: str = "simulated"
    cpus: float = Field(default=64.0, gt=0)
    memory_mb: int = Field(default=262_144, gt=0)
    schedulable: bool = Field(default=True, description="false: cordoned, nothing new is placed here")

    def node(self) -> Node:
        return Node(self.name, self.gpus, self.gpu_type, self.cpus, self.memory_mb, self.schedulable)


class TenantQuotaConfig(BaseModel):
    guaranteed_gpus: int = Field(default=0, ge=0)
    borrowing_limit_gpus: int | None = Field(default=None, ge=0, description="null: may borrow any idle GPU")
    weight: float = Field(default=1.0, gt=0, description="fair share weight")

    def quota(self) -> TenantQuota:
        return TenantQuota(self.guaranteed_gpus, self.borrowing_limit_gpus, self.weight)


class SchedulerConfig(BaseModel):
    preemption: bool = True
    min_runtime_s: float = Field(
        default=60.0, ge=0, allow_inf_nan=False, description="seconds a job runs before preemption"
    )
    max_reservations: int = Field(default=2, ge=0, description="waiting jobs that get nodes kept for them")
    preempt_drains: bool = Field(
        default=False,
        description="a job waiting for its nodes to drain halts the jobs on them (with a checkpoint) "
        "when the drain would idle more GPU-time than the halts lose",
    )
    checkpoint_cost_s: float = Field(
        default=120.0, ge=0, allow_inf_nan=False, description="GPU-seconds per GPU one halt and resume cost"
    )
    service_queues_gpu_hours: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default=[1.0, 16.0],
        description="least attained service: GPU-hours run that split each priority class into "
        "bands, the least served first (rising; [] turns it off)",
    )
    starve_after_s: float = Field(
        default=3 * 24 * 3600.0,
        gt=0,
        allow_inf_nan=False,
        description="a job of a lower band that waited this long is served first",
    )
    max_service_preemptions: int = Field(
        default=16, ge=0, description="a job halted this often stays in the top band (a loop guard)"
    )

    @model_validator(mode="after")
    def _rising(self) -> SchedulerConfig:
        hours = self.service_queues_gpu_hours
        if hours != sorted(set(hours)):
            raise ValueError(f"service_queues_gpu_hours must rise, each once: {hours}")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FFDL_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = Path(".ffdl")
    bus: str | None = Field(default=None, description="embedded:///DIR or kafka://HOST:PORT[,HOST:PORT]")
    heartbeats: str | None = Field(default=None, description="embedded:///FILE or etcd://HOST:PORT")
    election: str | None = Field(
        default=None,
        description="file:///DIR or etcd://HOST:PORT; default: the heartbeats' etcd, else data_dir",
    )
    launcher: Literal["local", "instant", "kubernetes"] = Field(
        default="local",
        description="instant: learners complete at once (benchmarks, scale tests); kubernetes: pods (kube)",
    )
    api: str = "http://127.0.0.1:8080"
    api_workers: int | None = Field(
        default=None,
        ge=1,
        description="processes serving the API on its one port, each a reader of the one projection "
        f"file; default: one per CPU this process may use, at most {MAX_DEFAULT_API_WORKERS}",
    )
    token: str | None = None
    partitions: int = Field(default=8, ge=1, le=1024)
    topic_prefix: str = "ffdl"
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)
    kube: KubeConfig = Field(default_factory=KubeConfig)
    nodes: list[NodeConfig] | None = None
    tenant_quotas: dict[str, TenantQuotaConfig] = Field(default_factory=dict)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    heartbeat_ttl_s: float = Field(default=5.0, gt=0)
    leader_ttl_s: float = Field(default=10.0, gt=0)
    monitor_grace_s: float = Field(default=15.0, ge=0)
    launch_timeout_s: float = Field(default=120.0, gt=0)
    stop_grace_s: float = Field(default=10.0, ge=0)
    restart_backoff_base_s: float = Field(default=1.0, ge=0)
    restart_backoff_max_s: float = Field(default=60.0, ge=0)
    learners_dir: Path | None = Field(
        default=None,
        description="local learners' files, outside data_dir (default: under the system temp directory)",
    )
    learner_user: str = Field(
        default="nobody",
        description="local launcher, platform running as root: whom learners' commands run as "
        "(a name, UID or UID:GID; root: as the platform itself, with no isolation)",
    )
    sandbox: Literal["bwrap", "off"] = Field(
        default="bwrap",
        description="local launcher: run every learner in a bubblewrap sandbox (the platform refuses to "
        "run tenant code when it cannot make one); off: unconfined, the operator's explicit choice",
    )
    sandbox_network: Literal["job", "host"] = Field(
        default="job",
        description="local launcher, sandboxed: job: each job's learners share a network namespace of "
        "their own, with only a loopback interface (nothing outside the job is reachable); host: they "
        "share the host's network, every port of its loopback interface included",
    )
    log_format: Literal["console", "json"] = "console"
    log_level: str = "info"
    tenants_file: Path | None = Field(
        default=None, description="tenants and token hashes (default DATA_DIR/tenants.json)"
    )
    mqtt: str | None = Field(
        default=None, description="mqtt://HOST:PORT: retained job status out, telemetry in"
    )
    max_request_bytes: int = Field(default=256 * 1024, gt=0)
    api_header_timeout_s: float = Field(
        default=10.0, gt=0, description="seconds a connection has to send a request's headers, whole"
    )
    api_max_connections: int = Field(
        default=1024, ge=1, description="open connections each API process keeps; more are closed at once"
    )
    direct_tenants: list[Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]] = Field(
        default_factory=list,
        description="tenants that write commands to the broker themselves, each to TOPIC_PREFIX.tenant."
        "NAME.commands (the workers relay them for that tenant; see docs/security.md)",
    )
    max_followers: int = Field(default=256, ge=1, description="open event and log streams, in all")
    max_followers_per_tenant: int = Field(default=16, ge=1, description="open streams per tenant")
    data_roots: list[Path] = Field(
        default_factory=list, description="absolute data_dir paths must be under one of these"
    )
    result_roots: list[Path] = Field(
        default_factory=list, description="absolute result_dir paths must be under one of these"
    )
    checkpoint_place: str | None = Field(
        default=None,
        description="where each job's checkpoints must lie: a directory or URI prefix with {job_id} "
        "(s3://bucket/ckpt/{job_id}); default: the launcher's checkpoint directory of the job",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = os.environ.get("FFDL_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    @model_validator(mode="after")
    def _learners_outside_the_data_dir(self) -> Settings:
        if self.work_dir.is_relative_to(self.data_dir.resolve()):
            raise ValueError(
                f"learners_dir {self.work_dir} is inside data_dir: learners could reach the platform's files"
            )
        return self

    @property
    def api_processes(self) -> int:
        """How many processes serve the API: ``api_workers``, or one per CPU this process may use
        (at most :data:`MAX_DEFAULT_API_WORKERS`). One serves in the platform's own process."""
        if self.api_workers is not None:
            return self.api_workers
        return min(usable_cpus(), MAX_DEFAULT_API_WORKERS)

    @property
    def restart_policy(self) -> RestartPolicy:
        """The owner's backoff between restarts; ``ffdl verify --redecide`` re-decides with it too."""
        return RestartPolicy(base_s=self.restart_backoff_base_s, max_backoff_s=self.restart_backoff_max_s)

    @property
    def bus_url(self) -> str:
        return self.bus or f"embedded://{self.data_dir.resolve()}"

    @property
    def heartbeats_url(self) -> str:
        return self.heartbeats or f"embedded://{(self.data_dir / 'heartbeats.sqlite').resolve()}"

    @property
    def tenants_path(self) -> Path:
        return (self.tenants_file or self.data_dir / "tenants.json").resolve()

    @property
    def election_url(self) -> str:
        """Where singleton roles elect their leader: etcd when the heartbeats live there, else a lock file."""
        if self.election:
            return self.election
        if self.heartbeats_url.startswith("etcd://"):
            return self.heartbeats_url
        return f"file://{self.data_dir.resolve()}"

    @property
    def work_dir(self) -> Path:
        """The local learners' root: ``learners_dir``, or a directory of this platform's user under
        the system temp directory, named after the data directory (one root per platform)."""
        if self.learners_dir is not None:
            return self.learners_dir.resolve()
        data_dir = self.data_dir.resolve()
        digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"ffdl-learners-{os.geteuid()}" / f"{data_dir.name}-{digest}"

    def job_dir(self, job_id: str) -> Path | None:
        """A job's directory under the work directory; None for an id that names no plain directory."""
        if not job_id or job_id in (".", "..") or "/" in job_id or "\0" in job_id:
            return None
        return self.work_dir / job_id

    @property
    def checkpoint_places(self) -> CheckpointPlaces:
        """Where the owner believes a job's reported checkpoints, and resumes from (DESIGN §6a):
        ``checkpoint_place``, else the launcher's checkpoint directory as its learners see it (on
        Kubernetes the job's own volume at one path in every pod; locally ``checkpoints/`` in the
        job's directory, as :mod:`ffdl.adapters.launchers.local` lays it out)."""
        if self.checkpoint_place:
            return CheckpointPlaces(self.checkpoint_place)
        if self.launcher == "kubernetes":
            return CheckpointPlaces(CHECKPOINT_DIR)
        return CheckpointPlaces(f"{self.work_dir.resolve()}/{JOB_ID_FIELD}/checkpoints")

    @property
    def projection_path(self) -> Path:
        return (self.data_dir / "projections.sqlite").resolve()

    def scheduler_policy(self) -> SchedulerPolicy:
        tenancy = TenancyPolicy({name: tenant.quota() for name, tenant in self.tenant_quotas.items()})
        s = self.scheduler
        return SchedulerPolicy(
            tenancy,
            s.preemption,
            s.min_runtime_s,
            s.max_reservations,
            preempt_drains=s.preempt_drains,
            checkpoint_cost_s=s.checkpoint_cost_s,
            service_queues=tuple(hours * 3600 for hours in s.service_queues_gpu_hours),
            starve_after_s=s.starve_after_s,
            max_service_preemptions=s.max_service_preemptions,
        )

    def inventory(self) -> list[Node]:
        from ffdl.adapters.gpus import detect_local_node  # noqa: PLC0415 - only when no nodes are configured

        if self.nodes:
            return [n.node() for n in self.nodes]
        return [detect_local_node()]
