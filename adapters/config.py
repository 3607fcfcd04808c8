"""Configuration: one optional YAML file (``FFDL_CONFIG``) plus ``FFDL_*`` environment overrides.

The default is fully embedded: the log, the heartbeats and the projections live in files under
``data_dir``, learners are local processes, and the inventory is one node with 8 simulated GPUs
(or the real NVIDIA GPUs of this machine, when there are any).

Scheduling: ``tenant_quotas`` gives each named tenant its guaranteed GPUs, borrowing limit and
fair share weight (tenants not named, like the API's ``default``, are unlimited with weight 1);
``scheduler`` sets preemption, the minimum runtime before a job may be preempted, and how many
waiting jobs get nodes reserved. A node with ``schedulable: false`` is cordoned: its jobs run on,
nothing new is placed there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ffdl.core.allocator import Node
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.tenancy import TenancyPolicy, TenantQuota


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
    min_runtime_s: float = Field(default=60.0, ge=0, description="seconds a job runs before preemption")
    max_reservations: int = Field(default=2, ge=0, description="waiting jobs that get nodes kept for them")


class KafkaConfig(BaseModel):
    """How a ``kafka://`` bus talks to its brokers: ``FFDL_KAFKA__ACKS=all``, ``FFDL_KAFKA__SASL_USERNAME``...

    The defaults suit one local broker with no security, such as the test broker tansu; docs/kafka.md
    gives the settings for an Apache Kafka cluster (replication, TLS, SASL, idempotence).
    """

    client_id: str = Field(default="ffdl", min_length=1, description="names ffdl in broker logs and quotas")
    acks: Literal["all", "1", "0"] = Field(default="all", description="all: every in-sync replica has it")
    enable_idempotence: bool = Field(default=False, description="needs acks=all and broker support")
    linger_ms: int = Field(default=0, ge=0, description="how long the producer waits to fill a batch")
    request_timeout_s: float = Field(default=40.0, gt=0, description="how long a request waits for a broker")
    replication_factor: int = Field(default=1, ge=1, description="replicas of the topics ffdl creates")
    min_insync_replicas: int | None = Field(default=None, ge=1, description="of the topics ffdl creates")
    session_timeout_s: float = Field(default=10.0, gt=0, description="a silent member loses its partitions")
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="at most a third of the session")
    fetch_max_wait_ms: int = Field(default=50, ge=0, description="how long a broker holds an empty fetch")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = Field(default=None, description="the CA that signed the brokers' certificates")
    ssl_certfile: Path | None = Field(default=None, description="client certificate, for mutual TLS")
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConfig:
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("enable_idempotence needs acks=all")
        uses_sasl = self.security_protocol.startswith("SASL")
        if uses_sasl and (self.sasl_username is None or self.sasl_password is None):
            raise ValueError(f"{self.security_protocol} needs sasl_username and sasl_password")
        return self


class KubeConfig(BaseModel):
    """How the Kubernetes launcher (``FFDL_LAUNCHER=kubernetes``) reaches the cluster and makes learner pods:
    ``FFDL_KUBE__NAMESPACE``, ``FFDL_KUBE__IMAGE``...; docs/kubernetes.md explains each."""

    api_url: str | None = Field(default=None, description="an API without credentials (kubectl proxy)")
    kubeconfig: str | None = Field(default=None, description="default: in-cluster, else ~/.kube/config")
    context: str | None = None
    namespace: str = "ffdl-jobs"
    image: str = Field(default="ffdl:latest", description="learner image (python, ffdl and tini)")
    service_account: str | None = None
    storage_claim: str | None = Field(default=None, description="ReadWriteMany PVC: checkpoints, results")
    run_as_user: int = Field(default=1000, gt=0)
    rendezvous_port: int = Field(default=29500, gt=0, lt=65536)
    cluster_domain: str = "cluster.local"
    gpu_type_labels: list[str] = Field(default_factory=lambda: ["ffdl.io/gpu-type", "nvidia.com/gpu.product"])
    pending_timeout_s: float = Field(default=60.0, gt=0, description="unschedulable this long: lost")
    orphan_check_s: float = Field(default=60.0, gt=0, description="how often orphaned pods are removed")


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
    token: str | None = None
    partitions: int = Field(default=8, ge=1, le=1024)
    topic_prefix: str = "ffdl"
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
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
    log_format: Literal["console", "json"] = "console"
    log_level: str = "info"
    tenants_file: Path | None = Field(
        default=None, description="tenants and token hashes (default DATA_DIR/tenants.json)"
    )
    mqtt: str | None = Field(
        default=None, description="mqtt://HOST:PORT: retained job status out, telemetry in"
    )
    max_request_bytes: int = Field(default=256 * 1024, gt=0)

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
        return (self.data_dir / "jobs").resolve()

    @property
    def projection_path(self) -> Path:
        return (self.data_dir / "projections.sqlite").resolve()

    def scheduler_policy(self) -> SchedulerPolicy:
        tenancy = TenancyPolicy({name: tenant.quota() for name, tenant in self.tenant_quotas.items()})
        s = self.scheduler
        return SchedulerPolicy(tenancy, s.preemption, s.min_runtime_s, s.max_reservations)

    def inventory(self) -> list[Node]:
        from ffdl.adapters.gpus import detect_local_node  # noqa: PLC0415 - only when no nodes are configured

        if self.nodes:
            return [n.node() for n in self.nodes]
        return [detect_local_node()]
