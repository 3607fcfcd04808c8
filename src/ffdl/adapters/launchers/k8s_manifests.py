"""What the Kubernetes launcher creates for a job: pure functions from a launch request to manifests.

Per job: a headless Service (the rendezvous: rank 0 is ``<pod>.<service>.<namespace>.svc.<domain>``),
a NetworkPolicy that lets only the job's own pods in and lets them reach out only to each other,
DNS and the heartbeat store (plus what the operator adds: ``extra_egress``), and, where the heartbeat
store authenticates, a Secret with the password of the job's own heartbeat login (the pods get the
user name and the password from it, and no other credential: no service-account token, nothing of
Kafka's or the platform's). Per attempt: one bare Pod per learner with ``restartPolicy: Never`` (the
platform is the learners' controller: no Job or StatefulSet restarts a command behind its back).
The Service owns the NetworkPolicy, the Secret and the pods, so deleting it removes everything the
job had.

Names are deterministic, so creating the same attempt twice meets ``409 AlreadyExists`` instead of
making a second set: ``ffdl-<job>`` for the job's objects and ``ffdl-<job>-a<attempt>-r<rank>`` for a
learner, lower-cased DNS labels of at most 63 characters; a job id that is not already a valid label
(too long, upper case, other characters) is shortened and suffixed with a hash of the whole id. The
labels ``ffdl.io/job``, ``ffdl.io/tenant``, ``ffdl.io/attempt`` and ``ffdl.io/rank`` select and
describe the objects; the exact job id and tenant are also kept in annotations, which allow any text.

Each learner runs ``tini -s -g -- python -I -u -m ffdl.learner.agent -- <command>``: the container runtime
signals only the container's first process, and tini forwards SIGTERM to the whole process group,
so the agent and the learner's command both get it, as they do from the local launcher.

Pure functions, no I/O: the manifests are validated against the Kubernetes OpenAPI models in tests.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ffdl.adapters.launchers.environment import (
    HEARTBEATS_PASSWORD_VARIABLE,
    HEARTBEATS_USERNAME_VARIABLE,
    REPORT_SOCKET_NAME,
    REPORT_SOCKET_VARIABLE,
    LearnerSite,
    learner_command,
    learner_environment,
)
from ffdl.events.model import LearnerPlacement
from ffdl.handlers.ports import LaunchRequest, LearnerHandle

KubeObject = dict[str, Any]

LABEL_JOB = "ffdl.io/job"
LABEL_TENANT = "ffdl.io/tenant"
LABEL_ATTEMPT = "ffdl.io/attempt"
LABEL_RANK = "ffdl.io/rank"
ANNOTATION_JOB_ID = "ffdl.io/job-id"
ANNOTATION_TENANT = "ffdl.io/tenant"
MANAGED_BY = {"app.kubernetes.io/managed-by": "ffdl", "app.kubernetes.io/component": "learner"}

#: Selects every object the launcher made, of any job.
ANY_JOB_SELECTOR = LABEL_JOB
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "learner"
RENDEZVOUS_PORT_NAME = "rendezvous"

WORK_DIR = "/ffdl/work"
CHECKPOINT_DIR = "/ffdl/checkpoints"
RESULT_DIR = "/ffdl/results"
#: The agent listens in its working directory (the learner's, in its own pod: the pod is the boundary).
REPORT_SOCKET = f"{WORK_DIR}/{REPORT_SOCKET_NAME}"
#: The key of the password in a job's heartbeat-login Secret.
PASSWORD_KEY = "password"
DNS_PORT = 53

#: Where cluster DNS runs (kube-dns / CoreDNS in kube-system), as a NetworkPolicy peer.
CLUSTER_DNS: KubeObject = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
#: Where the heartbeat store (etcd) runs, as a NetworkPolicy peer: deploy/README.md's etcd.
HEARTBEAT_STORE: KubeObject = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ffdl"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "etcd"}},
}

_DNS_LABEL_MAX = 63
_HASH_CHARS = 10
_LABEL_VALUE = re.compile(r"\A(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
#: What a shortened name or label ends with: a name that ends so is shortened too, so that no job
#: id names what another id was shortened to (a tenant that picks its job's id once took another
#: job's Service, and its stop deleted that job's pods).
_SHORTENED = re.compile(rf"(?:\A|-)[0-9a-f]{{{_HASH_CHARS}}}\Z")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class PodSettings:
    """How learner pods are made in this cluster (``Settings.kube`` fills it)."""

    namespace: str
    image: str
    heartbeats_url: str
    heartbeat_ttl_s: float = 5.0
    rendezvous_port: int = 29500
    cluster_domain: str = "cluster.local"
    service_account: str | None = None
    storage_claim: str | None = None
    run_as_user: int = 1000
    #: The most each scratch volume (/tmp, the working directory) may hold: the kubelet evicts a pod
    #: past it, so one job's learner cannot fill a node's disk under other tenants' pods.
    scratch_limit_mb: int = 16384
    termination_grace_s: int = 30
    gpu_type_labels: tuple[str, ...] = ("ffdl.io/gpu-type", "nvidia.com/gpu.product")
    entrypoint: tuple[str, ...] = ("tini", "-s", "-g", "--")
    python: str = "python"
    dns_peer: Mapping[str, Any] = field(default_factory=lambda: dict(CLUSTER_DNS))
    heartbeats_peer: Mapping[str, Any] = field(default_factory=lambda: dict(HEARTBEAT_STORE))
    #: More egress rules for learner pods (object storage, a package mirror...), as NetworkPolicy rules.
    extra_egress: tuple[Mapping[str, Any], ...] = ()

    @property
    def heartbeats_port(self) -> int | None:
        """The heartbeat store's TCP port; None for a store not on the network (tests' embedded one)."""
        return urlsplit(self.heartbeats_url).port


@dataclass(frozen=True, slots=True)
class PodLogin:
    """A job's heartbeat login as its pods get it: the user's name, the password from the Secret."""

    username: str
    secret: str


# --------------------------------------------------------------------------- names


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def dns_label(*parts: str) -> str:
    """``parts`` joined by '-' as a DNS label; shortened and hash-suffixed when it had to change."""
    raw = "-".join(parts)
    label = _NOT_DNS.sub("-", raw.lower()).strip("-")
    if label == raw and len(label) <= _DNS_LABEL_MAX and not _SHORTENED.search(label):
        return label
    keep = label[: _DNS_LABEL_MAX - _HASH_CHARS - 1].rstrip("-")
    return f"{keep}-{_digest(raw)}" if keep else _digest(raw)


def label_value(text: str) -> str:
    """``text`` as a label value: itself when valid, else shortened and hash-suffixed."""
    if len(text) <= _DNS_LABEL_MAX and _LABEL_VALUE.match(text) and not _SHORTENED.search(text):
        return text
    keep = _NOT_LABEL.sub("-", text)[: _DNS_LABEL_MAX - _HASH_CHARS - 1].strip("-_.")
    return f"{keep}-{_digest(text)}" if keep else _digest(text)


def service_name(job_id: str) -> str:
    """The name of the job's Service and NetworkPolicy."""
    return dns_label("ffdl", job_id)


def login_secret_name(job_id: str) -> str:
    """The name of the Secret with the password of the job's heartbeat login."""
    return dns_label("ffdl", job_id, "heartbeats")


def pod_name(job_id: str, attempt: int, rank: int) -> str:
    return dns_label("ffdl", job_id, f"a{attempt}", f"r{rank}")


def learner_of(pod: Mapping[str, Any]) -> LearnerHandle | None:
    """The learner a pod runs, from its annotation and labels; None for a pod that is not one."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    job_id = (metadata.get("annotations") or {}).get(ANNOTATION_JOB_ID)
    attempt, rank = labels.get(LABEL_ATTEMPT, ""), labels.get(LABEL_RANK, "")
    if not job_id or not attempt.isdigit() or not rank.isdigit():
        return None
    return LearnerHandle(job_id, int(attempt), int(rank))


def job_id_of(obj: Mapping[str, Any]) -> str | None:
    job_id = (obj.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_JOB_ID)
    return str(job_id) if job_id else None


# --------------------------------------------------------------------------- manifests


def _metadata(name: str, job_id: str, tenant: str, settings: PodSettings, **labels: str) -> KubeObject:
    return {
        "name": name,
        "namespace": settings.namespace,
        "labels": {
            **MANAGED_BY,
            LABEL_JOB: label_value(job_id),
            LABEL_TENANT: label_value(tenant),
            **labels,
        },
        "annotations": {ANNOTATION_JOB_ID: job_id, ANNOTATION_TENANT: tenant},
    }


def owner_reference(owner: Mapping[str, Any]) -> KubeObject:
    """A reference to ``owner`` (as the API answered it: with its uid) for its dependents."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }


def service_manifest(job_id: str, tenant: str, settings: PodSettings) -> KubeObject:
    """The headless Service that gives every learner of the job a stable DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(job_id), job_id, tenant, settings),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: label_value(job_id)},
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": settings.rendezvous_port,
                    "targetPort": settings.rendezvous_port,
                }
            ],
        },
    }


def network_policy_manifest(
    job_id: str, tenant: str, owner: Mapping[str, Any], settings: PodSettings
) -> KubeObject:
    """Only the job's own pods may connect to its pods, and they may connect only to each other (any
    port: the rendezvous, NCCL), to DNS, to the heartbeat store's port, and to ``extra_egress``: not
    to Kafka, the API or another job's pods."""
    job = {"podSelector": {"matchLabels": {LABEL_JOB: label_value(job_id)}}}
    metadata = _metadata(service_name(job_id), job_id, tenant, settings)
    metadata["ownerReferences"] = [owner_reference(owner)]
    dns_ports = [{"protocol": protocol, "port": DNS_PORT} for protocol in ("UDP", "TCP")]
    port = settings.heartbeats_port
    heartbeats = (
        []
        if port is None
        else [{"to": [dict(settings.heartbeats_peer)], "ports": [{"protocol": "TCP", "port": port}]}]
    )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            **job,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [job]}],
            "egress": [
                {"to": [job]},
                {"to": [dict(settings.dns_peer)], "ports": dns_ports},
                *heartbeats,
                *(dict(rule) for rule in settings.extra_egress),
            ],
        },
    }


def login_secret_manifest(
    job_id: str, tenant: str, owner: Mapping[str, Any], settings: PodSettings, password: str
) -> KubeObject:
    """The Secret that holds the password of the job's heartbeat login, owned by the job's Service."""
    metadata = _metadata(login_secret_name(job_id), job_id, tenant, settings)
    metadata["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {PASSWORD_KEY: base64.b64encode(password.encode()).decode()},
    }


def login_password(secret: Mapping[str, Any]) -> str:
    """The password a job's heartbeat-login Secret holds."""
    return base64.b64decode(secret["data"][PASSWORD_KEY]).decode()


def master_address(request: LaunchRequest, settings: PodSettings) -> str:
    """Rank 0's DNS name through the job's headless Service."""
    return learner_address(request, settings, 0)


def learner_address(request: LaunchRequest, settings: PodSettings, rank: int) -> str:
    """A learner's DNS name through the job's headless Service."""
    pod = pod_name(request.job_id, request.attempt, rank)
    return f"{pod}.{service_name(request.job_id)}.{settings.namespace}.svc.{settings.cluster_domain}"


def pod_manifest(
    request: LaunchRequest,
    learner: LearnerPlacement,
    owner: Mapping[str, Any],
    settings: PodSettings,
    login: PodLogin | None = None,
) -> KubeObject:
    """One learner's pod: pinned to its placement's node, with its GPUs, under the agent, with the
    job's heartbeat ``login`` (where the store authenticates) as its only credential."""
    spec = request.spec
    name = pod_name(request.job_id, request.attempt, learner.rank)
    site = LearnerSite(
        master_addr=master_address(request, settings),
        master_port=settings.rendezvous_port,
        checkpoint_dir=CHECKPOINT_DIR,
        default_result_dir=RESULT_DIR,
        heartbeats_url=settings.heartbeats_url,
        heartbeat_ttl_s=settings.heartbeat_ttl_s,
        files={REPORT_SOCKET_VARIABLE: REPORT_SOCKET},
        # The container's log is the learner's output: the agent adds only its warnings, as JSON.
        base={"HOME": WORK_DIR, "FFDL_LOG_LEVEL": "warning", "FFDL_LOG_FORMAT": "json"},
        # Every pod has an address of its own: TensorFlow's servers share the rendezvous port.
        worker_addresses=[
            f"{learner_address(request, settings, placed.rank)}:{settings.rendezvous_port}"
            for placed in request.placement.learners
        ],
    )
    # The device plugin gives the container exactly its GPUs, which it sees as 0..G-1.
    environment = learner_environment(request, learner, range(len(learner.gpus)), site)
    if not learner.gpus:
        # No device plugin answers for a pod without GPUs: an image's own NVIDIA_VISIBLE_DEVICES=all
        # would have the NVIDIA runtime (a node's default) give it every GPU of the node, other
        # jobs' included. The pod's environment overrides the image's.
        environment["NVIDIA_VISIBLE_DEVICES"] = "void"
    metadata = _metadata(
        name,
        request.job_id,
        request.tenant,
        settings,
        **{LABEL_ATTEMPT: str(request.attempt), LABEL_RANK: str(learner.rank)},
    )
    metadata["ownerReferences"] = [owner_reference(owner)]
    scratch = {"sizeLimit": f"{settings.scratch_limit_mb}Mi"}
    pod_spec: KubeObject = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": service_name(request.job_id),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": (
            settings.termination_grace_s if spec.stop_grace_s is None else math.ceil(spec.stop_grace_s)
        ),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": _node_terms(request, learner, settings)
            }
        },
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": spec.image or settings.image,
                "imagePullPolicy": "IfNotPresent",
                "command": [
                    *settings.entrypoint,
                    settings.python,
                    "-I",
                    "-u",
                    "-m",
                    "ffdl.learner.agent",
                    "--",
                    learner_command(spec),
                ],
                "workingDir": WORK_DIR,
                "env": [
                    *({"name": key, "value": value} for key, value in environment.items()),
                    *_login_env(login),
                ],
                "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": settings.rendezvous_port}],
                "resources": _resources(len(learner.gpus), spec.cpus, spec.memory_mb),
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "work", "mountPath": WORK_DIR},
                    *_storage_mounts(request.job_id, settings),
                ],
            }
        ],
        "volumes": [
            {"name": "tmp", "emptyDir": scratch},
            {"name": "work", "emptyDir": scratch},
            *_storage_volumes(settings),
        ],
    }
    if len(learner.gpus) > 0:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _login_env(login: PodLogin | None) -> list[KubeObject]:
    if login is None:
        return []
    password = {"secretKeyRef": {"name": login.secret, "key": PASSWORD_KEY}}
    return [
        {"name": HEARTBEATS_USERNAME_VARIABLE, "value": login.username},
        {"name": HEARTBEATS_PASSWORD_VARIABLE, "valueFrom": password},
    ]


def _node_terms(request: LaunchRequest, learner: LearnerPlacement, settings: PodSettings) -> KubeObject:
    """The placement's node, and (for a GPU learner that asks for a type) a node of that GPU type,
    under any of the labels the inventory reads the type from (terms are ORed)."""
    on_node = [{"key": "metadata.name", "operator": "In", "values": [learner.node]}]
    gpu_type = learner.gpu_type or request.spec.gpu_type
    if not learner.gpus or not gpu_type:
        return {"nodeSelectorTerms": [{"matchFields": on_node}]}
    return {
        "nodeSelectorTerms": [
            {
                "matchFields": on_node,
                "matchExpressions": [{"key": label, "operator": "In", "values": [gpu_type]}],
            }
            for label in settings.gpu_type_labels
        ]
    }


def _resources(gpus: int, cpus: float, memory_mb: int) -> KubeObject:
    requests = {"cpu": f"{math.ceil(cpus * 1000)}m", "memory": f"{memory_mb}Mi"}
    limits = {"memory": f"{memory_mb}Mi"}
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def _storage_volumes(settings: PodSettings) -> list[KubeObject]:
    if settings.storage_claim:
        return [{"name": "storage", "persistentVolumeClaim": {"claimName": settings.storage_claim}}]
    return [{"name": "checkpoints", "emptyDir": {}}, {"name": "results", "emptyDir": {}}]


def _storage_mounts(job_id: str, settings: PodSettings) -> list[KubeObject]:
    """Checkpoints and results: the job's own directories of the shared claim (so a restarted attempt
    on another node finds them), or, without a claim, scratch space that ends with the pod."""
    if settings.storage_claim:
        job_dir = service_name(job_id)
        return [
            {"name": "storage", "mountPath": CHECKPOINT_DIR, "subPath": f"{job_dir}/checkpoints"},
            {"name": "storage", "mountPath": RESULT_DIR, "subPath": f"{job_dir}/results"},
        ]
    return [
        {"name": "checkpoints", "mountPath": CHECKPOINT_DIR},
        {"name": "results", "mountPath": RESULT_DIR},
    ]
