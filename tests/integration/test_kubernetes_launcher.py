"""The Kubernetes launcher against kmock's API (tests/kube.py): what it creates, idempotence across
launches and restarts, cleanup, orphan removal. The launcher contract itself runs in
tests/contract/test_launcher_contract.py; here no kubelet runs unless a test starts one, so pods stay
Pending unless a test reports their status as a kubelet would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ffdl.adapters.launchers import k8s_client
from ffdl.adapters.launchers.k8s_client import KubeClient
from ffdl.adapters.launchers.k8s_manifests import (
    ANNOTATION_JOB_ID,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_RANK,
    LABEL_TENANT,
    PodSettings,
    label_value,
    pod_name,
    service_manifest,
    service_name,
)
from ffdl.adapters.launchers.kubernetes import KubernetesLauncher
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.ports import LaunchRequest, LearnerHandle
from tests.kube import (
    NAMESPACE,
    NETWORK_POLICIES,
    PODS,
    SERVICES,
    ApiServer,
    api_server,
    node_manifest,
    patch_pod_status,
    request_json,
    running_status,
    terminated_status,
)
from tests.services import wait_until_async

pytestmark = pytest.mark.integration


def kinds(api: ApiServer, plural: str) -> list[dict[str, Any]]:
    resource = {"pods": PODS, "services": SERVICES, "networkpolicies": NETWORK_POLICIES}[plural]
    return api.live(resource, NAMESPACE)


def request_for(
    job_id: str, *, attempt: int = 1, learners: int = 2, gpus: int = 1, tenant: str = "team-a"
) -> LaunchRequest:
    spec = JobSpec(name="mnist", command="python train.py", learners=learners, gpus=gpus, gpu_type="A100")
    placement = Placement(
        learners=tuple(
            LearnerPlacement(rank=rank, node=f"node-{rank % 2}", gpus=tuple(range(gpus)), gpu_type="A100")
            for rank in range(learners)
        )
    )
    return LaunchRequest(job_id, tenant, attempt, spec, placement, resume_from=None)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[ApiServer, str]]:
    async with api_server() as (api, url):
        for node in ("node-0", "node-1"):
            await request_json(api, "POST", "/api/v1/nodes", node_manifest(node))
        yield api, url


@pytest.fixture
async def client(cluster: tuple[ApiServer, str]) -> AsyncIterator[KubeClient]:
    kube = KubeClient.at(cluster[1])
    yield kube
    await kube.close()


SETTINGS = PodSettings(
    namespace=NAMESPACE, image="registry.example/ffdl:1", heartbeats_url="etcd://etcd:2379"
)


def launcher_on(client: KubeClient, **options: float) -> KubernetesLauncher:
    return KubernetesLauncher(client, SETTINGS, poll_interval_s=0.05, **options)


async def test_a_launch_makes_a_pod_per_learner_a_headless_service_and_a_policy_the_service_owns(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, _ = cluster
    request = request_for("mnist-1a2b")

    await launcher_on(client).launch(request)

    (service,) = kinds(api, "services")
    (policy,) = kinds(api, "networkpolicies")
    pods = sorted(kinds(api, "pods"), key=lambda pod: pod["metadata"]["name"])
    assert service["metadata"]["name"] == policy["metadata"]["name"] == service_name("mnist-1a2b")
    assert service["spec"]["clusterIP"] == "None"
    assert [pod["metadata"]["name"] for pod in pods] == [pod_name("mnist-1a2b", 1, rank) for rank in (0, 1)]
    owner = {
        "apiVersion": "v1",
        "kind": "Service",
        "name": service["metadata"]["name"],
        "uid": service["metadata"]["uid"],
    }
    for rank, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels[LABEL_JOB] == "mnist-1a2b"
        assert labels[LABEL_TENANT] == "team-a"
        assert (labels[LABEL_ATTEMPT], labels[LABEL_RANK]) == ("1", str(rank))
        assert pod["metadata"]["annotations"][ANNOTATION_JOB_ID] == "mnist-1a2b"
        assert pod["metadata"]["ownerReferences"] == [owner]
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
        assert pod["spec"]["restartPolicy"] == "Never"
    assert policy["metadata"]["ownerReferences"] == [owner]


async def test_a_hostile_tenants_image_and_command_get_pods_the_cluster_holds_in(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    """What the API server stores for a job of a hostile tenant (its own image, which may say USER
    root): non-root, no privilege escalation, no capability, seccomp, a read-only root, no token,
    bounded scratch, and a policy that lets it reach its peers, DNS and the heartbeat store only."""
    request = request_for("evil-1a2b", tenant="mallory")
    hostile = request.spec.model_copy(update={"image": "mallory/root:latest", "command": "cat /var/run/*"})
    await launcher_on(client).launch(
        LaunchRequest(request.job_id, "mallory", 1, hostile, request.placement, None)
    )

    api = cluster[0]
    (policy,) = kinds(api, "networkpolicies")
    for pod in kinds(api, "pods"):
        spec = pod["spec"]
        (container,) = spec["containers"]
        assert container["image"] == "mallory/root:latest"
        assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        hardening = container["securityContext"]
        assert hardening["allowPrivilegeEscalation"] is False and hardening["capabilities"] == {
            "drop": ["ALL"]
        }
        assert hardening["readOnlyRootFilesystem"] is True
        assert not {"hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"} & set(spec)
        scratch = [volume for volume in spec["volumes"] if volume["name"] in ("tmp", "work")]
        assert all(volume["emptyDir"].get("sizeLimit") for volume in scratch), scratch
    job = {"podSelector": {"matchLabels": {LABEL_JOB: "evil-1a2b"}}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [{"from": [job]}]
    peers, dns, heartbeats = policy["spec"]["egress"]
    assert peers == {"to": [job]}
    assert {port["port"] for port in dns["ports"]} == {53}
    assert heartbeats["ports"] == [{"protocol": "TCP", "port": 2379}]
    assert heartbeats["to"] == [dict(SETTINGS.heartbeats_peer)]


async def test_launching_the_same_attempt_twice_or_concurrently_makes_one_set(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, url = cluster
    request = request_for("twice", learners=3)
    other = KubeClient.at(url)
    try:
        await asyncio.gather(launcher_on(client).launch(request), launcher_on(other).launch(request))
        await launcher_on(client).launch(request)
    finally:
        await other.close()

    assert len(kinds(api, "pods")) == 3
    assert len(kinds(api, "services")) == len(kinds(api, "networkpolicies")) == 1
    assert await launcher_on(client).running() == [LearnerHandle("twice", 1, rank) for rank in range(3)]


async def test_a_platform_restarted_mid_launch_completes_the_one_set_of_pods(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, url = cluster
    request = request_for("restarted", learners=3)
    last_pod = pod_name("restarted", 1, 2)

    def creates_the_last_pod(http: object) -> bool:
        data = getattr(http, "data", None)
        return isinstance(data, dict) and data.get("metadata", {}).get("name") == last_pod

    crashed = KubeClient.at(url)
    async with api.holding(creates_the_last_pod) as arrived:
        launching = asyncio.create_task(launcher_on(crashed).launch(request))
        await asyncio.wait_for(arrived.wait(), 10)
        launching.cancel()  # the platform dies with the last create in flight
        await asyncio.gather(launching, return_exceptions=True)
        await crashed.close()
        assert len(kinds(api, "pods")) == 2
    await launcher_on(client).launch(request)  # the restarted platform re-drives the launch

    names = sorted(pod["metadata"]["name"] for pod in kinds(api, "pods"))
    assert names == sorted(pod_name("restarted", 1, rank) for rank in range(3))
    assert len(kinds(api, "services")) == 1


async def test_stop_removes_every_pod_of_every_attempt_and_the_jobs_service_and_policy(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, _ = cluster
    launcher = launcher_on(client)
    for attempt in (1, 2):
        await launcher.launch(request_for("stopped", attempt=attempt))
    await launcher.launch(request_for("kept"))

    await launcher.stop("stopped", 5.0)

    assert {pod["metadata"]["annotations"][ANNOTATION_JOB_ID] for pod in kinds(api, "pods")} == {"kept"}
    assert [service["metadata"]["name"] for service in kinds(api, "services")] == [service_name("kept")]
    assert [policy["metadata"]["name"] for policy in kinds(api, "networkpolicies")] == [service_name("kept")]


async def test_a_job_cannot_take_another_jobs_objects_nor_stop_its_pods(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    """A direct tenant picks its job's id. One that was another job's shortened Service name once
    made the launch take that Service as its own, and its stop delete the other job's Service,
    policy and (as their owner went) pods; one that was another's shortened label put its pods
    behind the other job's NetworkPolicy, and its stop deleted the other job's pods."""
    api, _ = cluster
    launcher = launcher_on(client)
    victim = "resnet.v2-1a2b3c4d"  # the API's id for the name resnet.v2: not a DNS label
    await launcher.launch(request_for(victim, tenant="victims"))
    squatter = service_name(victim).removeprefix("ffdl-")  # a valid id: it would be used as it is
    colliding = "imagenet-" + "x" * 60 + "-sweep"

    await launcher.launch(request_for(squatter, tenant="attackers"))
    await launcher.launch(request_for(colliding, tenant="victims"))
    await launcher.launch(request_for(label_value(colliding), tenant="attackers"))
    await launcher.stop(squatter, 5.0)
    await launcher.stop(label_value(colliding), 5.0)

    kept = {pod["metadata"]["annotations"][ANNOTATION_JOB_ID] for pod in kinds(api, "pods")}
    assert kept == {victim, colliding}
    assert {service["metadata"]["name"] for service in kinds(api, "services")} == {
        service_name(victim),
        service_name(colliding),
    }
    # and a name that is another job's anyway (made by hand, say) is refused, never used
    foreign = service_manifest("someone-else", "victims", SETTINGS)
    foreign["metadata"]["name"] = service_name("mine-0")
    await client.create(k8s_client.SERVICES, NAMESPACE, foreign)
    with pytest.raises(ValueError, match=f"the Service name {service_name('mine-0')} is another job's"):
        await launcher.launch(request_for("mine-0"))


async def test_deleting_the_jobs_service_removes_everything_it_owns(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, _ = cluster
    await launcher_on(client).launch(request_for("owned"))

    await request_json(api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{service_name('owned')}")

    await wait_until_async(lambda: not kinds(api, "pods") and not kinds(api, "networkpolicies"), 5, what="GC")


async def test_stop_waits_for_a_running_pod_and_force_deletes_it_when_its_node_does_not_answer(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, _ = cluster
    launcher = launcher_on(client, stop_slack_s=0.5)
    await launcher.launch(request_for("silent-node", learners=1))
    name = pod_name("silent-node", 1, 0)
    await request_json(
        api, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", {"spec": {"nodeName": "node-0"}}
    )
    await patch_pod_status(api, name, running_status("node-0"))

    started = time.monotonic()
    await launcher.stop("silent-node", 1.0)  # no kubelet confirms the end: the pod stays terminating

    assert 1.5 <= time.monotonic() - started < 10
    assert kinds(api, "pods") == []
    assert await launcher.running() == []


async def test_running_lists_unfinished_pods_only(cluster: tuple[ApiServer, str], client: KubeClient) -> None:
    api, _ = cluster
    launcher = launcher_on(client)
    await launcher.launch(request_for("finishing", learners=2))

    await patch_pod_status(api, pod_name("finishing", 1, 0), terminated_status(0))

    assert await launcher.running() == [LearnerHandle("finishing", 1, 1)]


async def test_remove_orphans_removes_the_objects_of_jobs_that_should_have_no_learners(
    cluster: tuple[ApiServer, str], client: KubeClient
) -> None:
    api, _ = cluster
    launcher = launcher_on(client)
    for job_id in ("live", "ended", "not-mine"):
        await launcher.launch(request_for(job_id, learners=1))
    await request_json(
        api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name('ended', 1, 0)}?gracePeriodSeconds=0"
    )  # a stop that died after the pods: only the service and the policy are left of "ended"
    await launcher.launch(request_for("halted", learners=1))

    removed = await launcher.remove_orphans(lambda job_id: job_id in ("live", "not-mine"), grace_s=1.0)

    assert sorted(removed) == ["ended", "halted"]
    assert sorted(pod["metadata"]["annotations"][ANNOTATION_JOB_ID] for pod in kinds(api, "pods")) == [
        "live",
        "not-mine",
    ]
    assert sorted(service["metadata"]["name"] for service in kinds(api, "services")) == [
        service_name("live"),
        service_name("not-mine"),
    ]
