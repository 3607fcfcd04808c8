"""The Kubernetes launcher's manifests: deterministic DNS-safe names, the learner environment, GPU
placement, isolation and hardening, each validated against the Kubernetes OpenAPI models."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ffdl.adapters.launchers.k8s_manifests import (
    CLUSTER_DNS,
    GPU_RESOURCE,
    HEARTBEAT_STORE,
    LABEL_JOB,
    WORK_DIR,
    PodLogin,
    PodSettings,
    dns_label,
    label_value,
    learner_of,
    login_password,
    login_secret_manifest,
    login_secret_name,
    network_policy_manifest,
    pod_manifest,
    pod_name,
    service_manifest,
    service_name,
)
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement
from ffdl.handlers.ports import LaunchRequest, LearnerHandle
from tests.kube import openapi_problems

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SETTINGS = PodSettings(
    namespace="jobs", image="registry.example/ffdl:1", heartbeats_url="etcd://etcd.ffdl:2379"
)
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ffdl-job", "uid": "0c8a-uid"}}


def request(job_id: str = "mnist-1a2b", *, gpus: int = 2, learners: int = 2, **spec: Any) -> LaunchRequest:
    job = JobSpec(name="mnist", command="python train.py --epochs 3", learners=learners, gpus=gpus, **spec)
    placement = Placement(
        learners=tuple(
            LearnerPlacement(rank=rank, node=f"gpu-{rank}", gpus=tuple(range(4, 4 + gpus)))
            for rank in range(learners)
        )
    )
    checkpoint = Checkpoint(rank=0, attempt=1, step=9, uri="file:///ffdl/checkpoints/step-9")
    return LaunchRequest(job_id, "Team A", 2, job, placement, resume_from=checkpoint)


LOGIN = PodLogin("ffdl-job-mnist-1a2b", login_secret_name("mnist-1a2b"))


def pod(
    launch: LaunchRequest, rank: int = 0, settings: PodSettings = SETTINGS, login: PodLogin | None = None
) -> dict[str, Any]:
    return pod_manifest(launch, launch.placement.learners[rank], SERVICE, settings, login)


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {
        item["name"]: item["value"] for item in manifest["spec"]["containers"][0]["env"] if "value" in item
    }


@pytest.mark.parametrize(
    "job_id",
    ["mnist-1a2b", "x" * 128, "Upper_Case.and.dots", "ends-with-dash-", "ünïcode-job", "a" * 60 + "-b"],
)
def test_names_are_dns_labels_of_at_most_63_characters(job_id: str) -> None:
    names = [service_name(job_id), pod_name(job_id, 12, 1023)]
    assert all(DNS_LABEL.match(name) and len(name) <= 63 for name in names), names
    assert LABEL_VALUE.match(label_value(job_id)) and len(label_value(job_id)) <= 63


def test_names_are_deterministic_readable_when_possible_and_distinct_when_shortened() -> None:
    assert pod_name("mnist-1a2b", 1, 0) == "ffdl-mnist-1a2b-a1-r0" == pod_name("mnist-1a2b", 1, 0)
    assert service_name("mnist-1a2b") == "ffdl-mnist-1a2b"
    assert label_value("mnist-1a2b") == "mnist-1a2b"
    long_a, long_b = "x" * 100 + "a", "x" * 100 + "b"
    assert pod_name(long_a, 1, 0) != pod_name(long_b, 1, 0)
    assert label_value(long_a) != label_value(long_b)
    assert dns_label("ffdl", "Job") != dns_label("ffdl", "job")  # a changed name carries a hash


def test_no_job_id_names_or_labels_what_another_was_shortened_to() -> None:
    """A tenant that picks its job's id took another job's Service this way, and its stop deleted
    that job's pods; or its pods carried the other job's label, which that job's NetworkPolicy
    admits."""
    victim = "resnet.v2-1a2b3c4d"  # what the API makes of the name resnet.v2: not a DNS label
    taken = service_name(victim).removeprefix("ffdl-")
    assert service_name(taken) != service_name(victim)
    long_victim = "imagenet-" + "x" * 60 + "-sweep"
    assert label_value(label_value(long_victim)) != label_value(long_victim)
    assert label_value("0123456789") != "0123456789"  # shortened to its digest alone, it would be
    assert label_value("mnist-1a2b3c4d") == "mnist-1a2b3c4d"  # what the API makes stays readable


def test_every_manifest_is_valid_against_the_kubernetes_openapi_models() -> None:
    launch = request()
    manifests = [
        pod(launch),
        pod(request(gpus=0)),
        pod(
            launch,
            settings=PodSettings(
                namespace="jobs",
                image="i",
                heartbeats_url="etcd://e:2379",
                service_account="learners",
                storage_claim="ffdl-storage",
            ),
        ),
        pod(launch, login=LOGIN),
        service_manifest(launch.job_id, launch.tenant, SETTINGS),
        network_policy_manifest(launch.job_id, launch.tenant, SERVICE, SETTINGS),
        login_secret_manifest(launch.job_id, launch.tenant, SERVICE, SETTINGS, "pw"),
    ]
    assert [problem for manifest in manifests for problem in openapi_problems(manifest)] == []


def test_a_learner_pod_is_bare_hardened_and_owned_by_the_jobs_service() -> None:
    manifest = pod(request())
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Service", "name": "ffdl-job", "uid": "0c8a-uid"}
    ]
    assert "/tmp" in {
        mount["mountPath"] for mount in container["volumeMounts"]
    }  # writable despite a read-only root


def test_a_learner_cannot_fill_its_nodes_disk_through_its_scratch_volumes() -> None:
    """A hostile learner writing without end into /tmp or its working directory is evicted by the
    kubelet at the scratch limit, not left to fill the disk under other tenants' pods."""
    spec = pod(request())["spec"]
    (container,) = spec["containers"]
    scratch = {
        mount["name"] for mount in container["volumeMounts"] if mount["mountPath"] in ("/tmp", WORK_DIR)
    }
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert scratch == {"tmp", "work"}
    for name in scratch:
        assert volumes[name]["emptyDir"] == {"sizeLimit": f"{SETTINGS.scratch_limit_mb}Mi"}


def test_a_learner_runs_the_command_under_tini_and_the_agent_from_the_configured_image() -> None:
    (container,) = pod(request())["spec"]["containers"]
    assert container["image"] == "registry.example/ffdl:1"
    assert container["command"] == [
        "tini",
        "-s",
        "-g",
        "--",
        "python",
        "-I",
        "-u",
        "-m",
        "ffdl.learner.agent",
        "--",
        "python train.py --epochs 3",
    ]
    (own_image,) = pod(request(image="user/trainer:2"))["spec"]["containers"]
    assert own_image["image"] == "user/trainer:2"


def test_a_gpu_learner_gets_its_gpus_pinned_to_its_node_and_its_gpu_type() -> None:
    manifest = pod(request(gpu_type="H100"), rank=1)
    (container,) = manifest["spec"]["containers"]
    assert (
        container["resources"]["requests"][GPU_RESOURCE]
        == container["resources"]["limits"][GPU_RESOURCE]
        == "2"
    )
    assert container["resources"]["requests"]["cpu"] == "1000m"
    assert container["resources"]["limits"]["memory"] == "1024Mi"
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}],
            "matchExpressions": [{"key": label, "operator": "In", "values": ["H100"]}],
        }
        for label in SETTINGS.gpu_type_labels
    ]
    assert manifest["spec"]["tolerations"] == [
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_cpu_learner_asks_for_no_gpu_and_no_gpu_type() -> None:
    manifest = pod(request(gpus=0, gpu_type="H100"))
    (container,) = manifest["spec"]["containers"]
    assert GPU_RESOURCE not in container["resources"]["requests"]
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0"]}]}
        ]
    }
    assert "tolerations" not in manifest["spec"]
    # no device plugin answers for it: an image's NVIDIA_VISIBLE_DEVICES=all would have the NVIDIA
    # runtime give it every GPU of the node
    assert env_of(manifest)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(pod(request()))  # the device plugin's to set


def test_the_environment_contract_points_at_rank_0_through_the_headless_service() -> None:
    env = env_of(pod(request(), rank=1))
    assert env["MASTER_ADDR"] == "ffdl-mnist-1a2b-a2-r0.ffdl-mnist-1a2b.jobs.svc.cluster.local"
    assert env["MASTER_PORT"] == "29500"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the container holds exactly its two GPUs
    assert (env["RANK"], env["WORLD_SIZE"], env["LEARNER_ID"], env["FFDL_ATTEMPT"]) == ("1", "2", "2", "2")
    assert env["FFDL_RESUME_FROM"] == "/ffdl/checkpoints/step-9"
    assert env["FFDL_HEARTBEATS"] == "etcd://etcd.ffdl:2379"
    assert env["FFDL_CHECKPOINT_DIR"] == env["CHECKPOINT_DIR"] == "/ffdl/checkpoints"
    assert "FFDL_LOG_FILE" not in env  # the learner's output is the container's log


def test_checkpoints_and_results_live_in_the_jobs_own_directories_of_the_storage_claim() -> None:
    settings = PodSettings(
        namespace="jobs", image="i", heartbeats_url="etcd://e:2379", storage_claim="ffdl-storage"
    )
    spec = pod(request(), settings=settings)["spec"]
    mounts = {mount["mountPath"]: mount.get("subPath") for mount in spec["containers"][0]["volumeMounts"]}
    assert mounts["/ffdl/checkpoints"] == "ffdl-mnist-1a2b/checkpoints"
    assert mounts["/ffdl/results"] == "ffdl-mnist-1a2b/results"
    assert {"name": "storage", "persistentVolumeClaim": {"claimName": "ffdl-storage"}} in spec["volumes"]


def test_the_network_policy_admits_only_the_jobs_pods_and_lets_them_reach_only_peers_dns_heartbeats() -> None:
    policy = network_policy_manifest("mnist-1a2b", "Team A", SERVICE, SETTINGS)
    job = {"podSelector": {"matchLabels": {LABEL_JOB: "mnist-1a2b"}}}
    assert policy["spec"] == {
        **job,
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [job]}],
        "egress": [
            {"to": [job]},
            {
                "to": [CLUSTER_DNS],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
            {"to": [HEARTBEAT_STORE], "ports": [{"protocol": "TCP", "port": 2379}]},
        ],
    }
    object_storage = {
        "to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    opened = PodSettings(
        namespace="jobs", image="i", heartbeats_url="etcd://e:2380", extra_egress=(object_storage,)
    )
    egress = network_policy_manifest("j", "t", SERVICE, opened)["spec"]["egress"]
    assert egress[2]["ports"] == [{"protocol": "TCP", "port": 2380}]
    assert egress[3:] == [object_storage]


def test_a_learner_pod_holds_no_credential_but_its_jobs_heartbeat_login() -> None:
    without = pod(request())
    assert all("valueFrom" not in item for item in without["spec"]["containers"][0]["env"])
    assert "FFDL_HEARTBEATS_USERNAME" not in env_of(without)
    with_login = pod(request(), login=LOGIN)
    spec = with_login["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert all("secret" not in volume and "projected" not in volume for volume in spec["volumes"])
    (container,) = spec["containers"]
    assert "envFrom" not in container
    assert env_of(with_login)["FFDL_HEARTBEATS_USERNAME"] == "ffdl-job-mnist-1a2b"
    from_secrets = [item for item in container["env"] if "valueFrom" in item]
    assert from_secrets == [
        {
            "name": "FFDL_HEARTBEATS_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "ffdl-mnist-1a2b-heartbeats", "key": "password"}},
        }
    ]


def test_the_login_secret_holds_the_password_and_belongs_to_the_jobs_service() -> None:
    secret = login_secret_manifest("mnist-1a2b", "Team A", SERVICE, SETTINGS, "s3cret/+=")
    assert secret["metadata"]["name"] == login_secret_name("mnist-1a2b") == "ffdl-mnist-1a2b-heartbeats"
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Service", "name": "ffdl-job", "uid": "0c8a-uid"}
    ]
    assert login_password(secret) == "s3cret/+="
    assert "s3cret" not in str(secret)  # base64, as the API keeps it


def test_the_service_is_headless_and_selects_the_jobs_pods() -> None:
    service = service_manifest("mnist-1a2b", "Team A", SETTINGS)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {LABEL_JOB: "mnist-1a2b"}
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_a_pods_learner_is_read_back_from_its_labels_and_annotations() -> None:
    job_id = "Some_Job-" + "y" * 90
    manifest = pod(request(job_id))
    assert learner_of(manifest) == LearnerHandle(job_id, 2, 0)
    assert learner_of({"metadata": {"labels": {}}}) is None
