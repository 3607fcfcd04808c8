"""Pod and node watches against kmock's API (tests/kube.py): what the cluster shows becomes learner
observations for the jobs' owners (on a real embedded bus) and the scheduler's inventory. The test
plays the kubelet: it reports pod states through the /status subresource as a kubelet would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore
from ffdl.adapters.launchers import k8s_watch
from ffdl.adapters.launchers.k8s_client import KubeClient
from ffdl.adapters.launchers.k8s_manifests import PodSettings, pod_name
from ffdl.adapters.launchers.k8s_watch import NodeInventory, PodWatcher
from ffdl.adapters.launchers.kubernetes import KubernetesLauncher
from ffdl.core.allocator import Node
from ffdl.core.authorization import Principal
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import Command
from ffdl.events.job_events import REASON_MAX
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.heartbeat_keys import encode_exit, exit_key
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.ports import LaunchRequest, Snapshot, StoreUnavailable
from tests.kube import (
    NAMESPACE,
    PODS,
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

SETTINGS = PodSettings(namespace=NAMESPACE, image="ffdl:test", heartbeats_url="etcd://etcd:2379")
PENDING_TIMEOUT_S = 0.5
TOPICS = Topics()


class FreezableStore(EmbeddedHeartbeatStore):
    """The heartbeat store, which can be made to stop answering (a frozen etcd keeps its connections):
    a read then hangs, or with ``deadline_s`` fails after that long, as the etcd store's deadline
    makes it (counted in ``deadlines``)."""

    frozen = False
    deadline_s: float | None = None
    deadlines = 0

    async def snapshot(self, prefix: str) -> Snapshot:
        if self.frozen:
            if self.deadline_s is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.deadline_s)
            self.deadlines += 1
            raise StoreUnavailable(f"no answer in {self.deadline_s} s")
        return await super().snapshot(prefix)


class Cluster:
    """kmock's API with two nodes, a launcher, a pod watcher and a node inventory reporting on a bus."""

    def __init__(
        self, api: ApiServer, client: KubeClient, bus: EmbeddedBus, heartbeats: FreezableStore
    ) -> None:
        self.api = api
        self.bus = bus
        self.heartbeats = heartbeats
        self.launcher = KubernetesLauncher(client, SETTINGS)
        self.owned = {"job-a"}
        sender = CommandSender(bus, TOPICS, "pods@test", Principal.platform("pods"))
        self.watcher = PodWatcher(
            client,
            NAMESPACE,
            sender,
            owns=lambda job_id: job_id in self.owned,
            pending_timeout_s=PENDING_TIMEOUT_S,
            check_interval_s=0.05,
            watch_timeout_s=1,
            heartbeats=heartbeats,
        )
        self.nodes = NodeInventory(
            client,
            gpu_type_labels=SETTINGS.gpu_type_labels,
            on_node_lost=self.watcher.node_lost,
            watch_timeout_s=1,
        )

    async def launch(self, job_id: str = "job-a", learners: int = 1, node: str = "node-0") -> None:
        spec = JobSpec(name="job", command="train", learners=learners, gpus=1, memory_mb=2048)
        placement = Placement(
            learners=tuple(LearnerPlacement(rank=rank, node=node, gpus=(rank,)) for rank in range(learners))
        )
        await self.launcher.launch(LaunchRequest(job_id, "team-a", 1, spec, placement, resume_from=None))

    async def bind(self, job_id: str = "job-a", rank: int = 0, node: str = "node-0") -> str:
        """What the scheduler does: put the pod on its node."""
        name = pod_name(job_id, 1, rank)
        await request_json(
            self.api, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", {"spec": {"nodeName": node}}
        )
        return name

    async def seen_running(self, name: str) -> None:
        """Wait until the pod watcher's copy of the pod shows it running."""

        def running() -> bool:
            pod = self.watcher.informer.objects.get(name, {})
            return bool(pod.get("status", {}).get("phase") == "Running")

        await wait_until_async(running, 5, what=f"{name} running in the watcher's copy")

    async def commands(self) -> list[Command]:
        return [command_from_json(record.value) async for record in self.bus.read(TOPICS.commands, 0)]

    async def reports(self, count: int) -> list[Any]:
        """The first ``count`` observations sent, once that many were."""
        found: list[Command] = []

        async def sent() -> bool:
            found[:] = await self.commands()
            return len(found) >= count

        await wait_until_async(sent, 10, what=f"{count} observations")
        return [command.data for command in found]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with api_server() as (api, url):
        for node in ("node-0", "node-1"):
            await request_json(api, "POST", "/api/v1/nodes", node_manifest(node, gpus=4))
        client = KubeClient.at(url)
        bus = EmbeddedBus(tmp_path / "log.sqlite", partitions=1)
        await bus.start()
        heartbeats = FreezableStore(tmp_path / "heartbeats.sqlite")
        harness = Cluster(api, client, bus, heartbeats)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(harness.watcher.run(stop)), asyncio.create_task(harness.nodes.run(stop))]
        await asyncio.wait_for(harness.watcher.informer.synced.wait(), 10)
        await asyncio.wait_for(harness.nodes.informer.synced.wait(), 10)
        try:
            yield harness
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await bus.close()
            await heartbeats.close()
            await client.close()


@pytest.mark.parametrize("deleted", [False, True])
async def test_the_checkpoint_a_learner_s_exit_record_names_is_reported_before_its_end(
    cluster: Cluster, deleted: bool
) -> None:
    """A halt deletes the pods; the agent saves on SIGTERM and names the checkpoint in its exit record.
    The owner decides the halt's resume point on the last learner's end, so the checkpoint comes
    first, in the same append, whatever the monitor (another producer) has sent by then."""
    await cluster.launch()
    name = await cluster.bind()
    claimed = {"uri": "file:///ckpt/40.pt", "step": 40, "rank": 3, "attempt": 9}  # rank, attempt: the pod's
    await cluster.heartbeats.put(exit_key("job-a", 1, 0), encode_exit(-15, claimed))
    await patch_pod_status(cluster.api, name, running_status())
    await cluster.seen_running(name)

    if deleted:
        await request_json(
            cluster.api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
        )
    else:
        await patch_pod_status(cluster.api, name, terminated_status(143))

    saved, ended = await cluster.reports(2)
    assert saved == cmd.ReportCheckpoint(
        checkpoint=Checkpoint(uri="file:///ckpt/40.pt", step=40, rank=0, attempt=1)
    )
    assert isinstance(ended, cmd.ReportLearnerLost if deleted else cmd.ReportLearnerExited)
    assert (ended.rank, ended.attempt) == (0, 1)


async def test_while_the_store_does_not_answer_a_gang_s_ends_wait_out_its_deadline_once_not_each(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods are handled one after another: each reading its exit record for the store's whole
    deadline would hold a halted gang's ends for a deadline per pod."""
    monkeypatch.setattr(k8s_watch, "QUIET_STORE_WAIT_S", 0.3)
    await cluster.launch(learners=5)
    names = [await cluster.bind(rank=rank) for rank in range(5)]
    for name in names:
        await patch_pod_status(cluster.api, name, running_status())
        await cluster.seen_running(name)
    cluster.heartbeats.frozen, cluster.heartbeats.deadline_s = True, 2.0

    for name in names[:4]:
        await patch_pod_status(cluster.api, name, terminated_status(143))
    ended = await cluster.reports(4)

    assert [(type(report), report.rank) for report in ended] == [
        (cmd.ReportLearnerExited, r) for r in range(4)
    ]
    assert cluster.heartbeats.deadlines == 1
    # The store answers again: the next end reads its record, and its checkpoint goes first.
    cluster.heartbeats.frozen = False
    await cluster.heartbeats.put(
        exit_key("job-a", 1, 4), encode_exit(-15, {"uri": "file:///c/7.pt", "step": 7})
    )
    await patch_pod_status(cluster.api, names[4], terminated_status(143))
    *_, saved, last = await cluster.reports(6)
    assert saved == cmd.ReportCheckpoint(
        checkpoint=Checkpoint(uri="file:///c/7.pt", step=7, rank=4, attempt=1)
    )
    assert isinstance(last, cmd.ReportLearnerExited) and last.rank == 4


async def test_a_learner_that_exits_is_reported_with_its_exit_code_and_its_start_is_left_to_heartbeats(
    cluster: Cluster,
) -> None:
    await cluster.launch()
    name = await cluster.bind()

    await patch_pod_status(cluster.api, name, running_status())
    await patch_pod_status(cluster.api, name, terminated_status(3))

    (exited,) = await cluster.reports(1)
    assert exited == cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=3)
    commands = await cluster.commands()
    assert [(command.job_id, command.tenant) for command in commands] == [("job-a", "team-a")]


async def test_a_container_killed_by_a_signal_reports_the_signal_as_the_agent_does(cluster: Cluster) -> None:
    await cluster.launch()
    name = await cluster.bind()

    await patch_pod_status(cluster.api, name, terminated_status(137))

    (exited,) = await cluster.reports(1)
    assert exited == cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=-9)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (
            terminated_status(137, reason="OOMKilled"),
            "OOMKilled: the learner ran out of memory (limit 2048Mi)",
        ),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
            "Evicted: The node was low on resource: memory.",
        ),
        *[
            (
                {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": "learner",
                            "state": {"waiting": {"reason": reason, "message": "no such image"}},
                        }
                    ],
                },
                f"{reason}: no such image",
            )
            for reason in (
                "ErrImagePull",
                "ImagePullBackOff",
                "CrashLoopBackOff",
                "CreateContainerConfigError",
            )
        ],
    ],
    ids=["oom", "evicted", "err-image-pull", "image-pull-backoff", "crash-loop", "bad-config"],
)
async def test_pod_failures_become_a_lost_learner_with_the_kubernetes_reason(
    cluster: Cluster, status: dict[str, Any], reason: str
) -> None:
    await cluster.launch()
    name = await cluster.bind()

    await patch_pod_status(cluster.api, name, status)

    (lost,) = await cluster.reports(1)
    assert isinstance(lost, cmd.ReportLearnerLost)
    assert (lost.rank, lost.attempt, lost.reason) == (0, 1, LossReason.VANISHED)
    assert lost.detail.startswith(reason)


async def test_a_kubernetes_message_longer_than_a_reason_is_cut_and_the_loss_still_reported(
    cluster: Cluster,
) -> None:
    """An image pull's message (a long image reference, several times, and the registry's words)
    passed 2,000 characters: building the report raised, the pod watcher's role restarted, and the
    pod, already in its copy, was never reported."""
    await cluster.launch()
    name = await cluster.bind()
    message = "failed to pull and unpack image " + "registry.example/" + "x" * 2100
    waiting = {"state": {"waiting": {"reason": "ErrImagePull", "message": message}}}

    await patch_pod_status(
        cluster.api, name, {"phase": "Pending", "containerStatuses": [{"name": "learner", **waiting}]}
    )

    (lost,) = await cluster.reports(1)
    assert isinstance(lost, cmd.ReportLearnerLost)
    assert len(lost.detail) == REASON_MAX and lost.detail.startswith("ErrImagePull: failed to pull")
    assert lost.detail.endswith("\u2026")


async def test_a_pod_pending_unschedulable_beyond_the_timeout_is_a_lost_learner(cluster: Cluster) -> None:
    await cluster.launch(node="node-9")
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    }
    started = asyncio.get_running_loop().time()

    await patch_pod_status(cluster.api, pod_name("job-a", 1, 0), {"conditions": [unschedulable]})

    (lost,) = await cluster.reports(1)
    assert asyncio.get_running_loop().time() - started >= PENDING_TIMEOUT_S
    assert isinstance(lost, cmd.ReportLearnerLost)
    assert lost.detail.startswith("Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")


async def test_a_pod_deleted_behind_the_platforms_back_is_a_lost_learner(cluster: Cluster) -> None:
    await cluster.launch()
    name = await cluster.bind()
    await patch_pod_status(cluster.api, name, running_status())

    await request_json(
        cluster.api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
    )

    (lost,) = await cluster.reports(1)
    assert isinstance(lost, cmd.ReportLearnerLost)
    assert lost.detail.startswith("Deleted")


async def test_each_observation_is_sent_once_and_only_for_jobs_this_process_owns(cluster: Cluster) -> None:
    await cluster.launch("job-b")
    await cluster.launch()
    name = await cluster.bind()
    other = await cluster.bind("job-b")
    for pod in (name, other):
        await patch_pod_status(cluster.api, pod, running_status())
        await patch_pod_status(cluster.api, pod, running_status())  # a repeated status changes nothing
        await patch_pod_status(cluster.api, pod, terminated_status(0))

    await cluster.reports(1)
    await asyncio.sleep(0.3)  # time for a wrong extra report to arrive
    commands = await cluster.commands()
    assert [(command.job_id, command.type) for command in commands] == [("job-a", "ReportLearnerExited")]


async def test_after_410_gone_the_watch_relists_and_reports_what_it_missed(cluster: Cluster) -> None:
    await cluster.launch()
    name = await cluster.bind()
    lists_before = sum(1 for request in cluster.api if request.action == "LIST" and request.resource == PODS)

    async with cluster.api.watches_paused():
        await patch_pod_status(cluster.api, name, terminated_status(137, reason="OOMKilled"))
        cluster.api.compact()

    (lost,) = await cluster.reports(1)
    assert isinstance(lost, cmd.ReportLearnerLost)
    assert lost.detail.startswith("OOMKilled")
    lists_after = sum(1 for request in cluster.api if request.action == "LIST" and request.resource == PODS)
    assert lists_after == lists_before + 1


async def test_a_watch_that_the_server_ends_resumes_from_its_resource_version(cluster: Cluster) -> None:
    await cluster.launch()
    name = await cluster.bind()
    await patch_pod_status(cluster.api, name, running_status())
    await cluster.seen_running(name)

    def pod_watches() -> list[Any]:
        return [request for request in cluster.api if request.action == "WATCH" and request.resource == PODS]

    watches = len(pod_watches())
    await wait_until_async(
        lambda: len(pod_watches()) > watches, 5, what="the watch to be renewed (1 s timeout)"
    )
    await patch_pod_status(cluster.api, name, terminated_status(0))

    (exited,) = await cluster.reports(1)
    assert exited == cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)
    assert pod_watches()[-1].params["resourceVersion"] not in ("", "0")
    assert sum(1 for request in cluster.api if request.action == "LIST" and request.resource == PODS) == 1


async def test_the_inventory_holds_the_ready_nodes_with_their_gpus_and_gpu_type(cluster: Cluster) -> None:
    await request_json(
        cluster.api, "POST", "/api/v1/nodes", node_manifest("node-h100", gpus=8, gpu_type="H100")
    )
    await request_json(cluster.api, "POST", "/api/v1/nodes", node_manifest("node-down", ready=False))
    await request_json(cluster.api, "PATCH", "/api/v1/nodes/node-1", {"spec": {"unschedulable": True}})

    expected = [
        Node("node-0", 4, "A100", 64.0, 262_144),
        Node("node-1", 4, "A100", 64.0, 262_144, schedulable=False),
        Node("node-h100", 8, "H100", 64.0, 262_144),
    ]
    await wait_until_async(lambda: cluster.nodes.inventory() == expected, 5, what=f"inventory == {expected}")


async def test_a_node_that_goes_not_ready_leaves_the_inventory_and_its_learners_are_lost(
    cluster: Cluster,
) -> None:
    await cluster.launch(learners=2)
    for rank in (0, 1):
        name = await cluster.bind(rank=rank)
        await patch_pod_status(cluster.api, name, running_status())
        await cluster.seen_running(name)
    not_ready = node_manifest("node-0", gpus=4, ready=False)["status"]
    cluster.heartbeats.frozen = True  # a lost node's learners wrote no exit record: nothing is read

    await request_json(cluster.api, "PATCH", "/api/v1/nodes/node-0/status", {"status": not_ready})

    lost = await cluster.reports(2)
    assert all(isinstance(report, cmd.ReportLearnerLost) for report in lost)
    assert sorted(report.rank for report in lost) == [0, 1]
    assert all(report.detail.startswith("NodeLost: node node-0 is NotReady") for report in lost)
    assert [node.name for node in cluster.nodes.inventory()] == ["node-1"]
    seen = cluster.nodes.observe()
    assert seen is not None and list(seen.nodes) == ["node-1"]
    assert seen.lost == {"node-0": "node node-0 is NotReady (KubeletReady)"}, "lost, not gone: it may return"


async def test_a_node_not_ready_with_a_message_of_any_length_is_lost_with_a_reason_within_bounds(
    cluster: Cluster,
) -> None:
    """Kubernetes' message has no bound: quoted whole, the node's loss was too long a reason for the
    scheduler's ReportNodeLost, which raised in its every planning step."""
    not_ready = node_manifest("node-0", gpus=4, ready=False)["status"]
    not_ready["conditions"][0]["message"] = "m" * 5_000

    await request_json(cluster.api, "PATCH", "/api/v1/nodes/node-0/status", {"status": not_ready})

    await wait_until_async(
        lambda: [n.name for n in cluster.nodes.inventory()] == ["node-1"], 5, what="node-0 lost"
    )
    seen = cluster.nodes.observe()
    assert seen is not None
    reason = seen.lost["node-0"]
    assert reason.startswith("node node-0 is NotReady (KubeletReady: mmm") and len(reason) == REASON_MAX
    assert nd.ReportNodeLost(reason=reason).reason == reason


async def test_a_deleted_node_leaves_the_inventory(cluster: Cluster) -> None:
    await request_json(cluster.api, "DELETE", "/api/v1/nodes/node-1")

    await wait_until_async(
        lambda: [n.name for n in cluster.nodes.inventory()] == ["node-0"], 5, what="node-1 gone"
    )
    seen = cluster.nodes.observe()
    assert seen is not None and list(seen.nodes) == ["node-0"] and seen.lost == {}, "deleted: gone, not lost"
