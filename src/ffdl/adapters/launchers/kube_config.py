"""How the Kubernetes launcher reaches the cluster and makes learner pods: the adapter's settings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ffdl.adapters.launchers.k8s_manifests import CLUSTER_DNS, HEARTBEAT_STORE


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
    scratch_limit_mb: int = Field(
        default=16384,
        ge=16,
        description="each scratch volume of a learner pod (/tmp, its working directory): past it the kubelet "
        "evicts the pod, before it fills the node's disk",
    )
    rendezvous_port: int = Field(default=29500, gt=0, lt=65536)
    cluster_domain: str = "cluster.local"
    gpu_type_labels: list[str] = Field(default_factory=lambda: ["ffdl.io/gpu-type", "nvidia.com/gpu.product"])
    pending_timeout_s: float = Field(default=60.0, gt=0, description="unschedulable this long: lost")
    orphan_check_s: float = Field(default=60.0, gt=0, description="how often orphaned pods are removed")
    dns_peer: dict[str, Any] = Field(
        default_factory=lambda: dict(CLUSTER_DNS), description="NetworkPolicy peer: cluster DNS"
    )
    heartbeats_peer: dict[str, Any] = Field(
        default_factory=lambda: dict(HEARTBEAT_STORE),
        description="NetworkPolicy peer: the heartbeat store (etcd) learner pods report to",
    )
    learner_egress: list[dict[str, Any]] = Field(
        default_factory=list,
        description="more NetworkPolicy egress rules for learner pods (object storage...); none by default",
    )
