"""What the cluster says about learners and nodes, turned into observations and an inventory.

With the agent inside each pod, heartbeats still flow through the heartbeat store; the pods
themselves add what the agent cannot report: a learner that never started (unschedulable, its image
cannot be pulled, its container cannot be created), one killed for memory (OOMKilled), an evicted
pod, a pod deleted behind the platform's back, and the loss of a whole node.

* :class:`Informer` keeps a local copy of one kind of object: it lists, then watches from the list's
  resource version, resumes each ended stream from the last version it saw, and relists after a
  ``410 Gone`` (the version was compacted away) or an outage, diffing the new list against its copy
  so that nothing that changed meanwhile is missed.
* :class:`PodWatcher` classifies every learner pod it sees (:func:`observe_pod`) and sends the
  job's owner how its learner ended: ``ReportLearnerExited`` (the container's exit code, a death by
  signal N as -N like the agent) or ``ReportLearnerLost`` with the Kubernetes reason in the detail.
  It is sent once per pod, with a command id derived from the pod's uid, so a resend after a restart
  is dropped by the owner; pending-too-long is found by a periodic check. Before it, in the same
  append, goes the checkpoint the learner's exit record names (the agent saves on SIGTERM, say, as
  its pod is deleted for a halt): the owner decides a halt's resume point on the last learner's end,
  and the monitor's report of that checkpoint, another producer's, has no fixed order against this
  one (:mod:`ffdl.handlers.exit_records`). A running container is not
  reported: a learner has started when its agent's first heartbeat arrives (the monitor reports
  that), and reporting it earlier would move the job to RUNNING before any heartbeat exists, leaving
  the agent only the monitor's grace instead of the launch timeout to register.
* :class:`NodeInventory` is the scheduler's inventory when the Kubernetes launcher is chosen: the
  Ready nodes with their allocatable ``nvidia.com/gpu``, CPU and memory and their GPU-type label
  (a cordoned node is kept, unschedulable). A node that goes NotReady or is deleted leaves the
  inventory (the scheduler halts its jobs to resume elsewhere) and its learners are reported lost.

Concurrency: each informer runs as one task that owns its copy; callbacks run in that task, one
at a time. Observations of jobs this process does not own (``owns``) are left to their owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import structlog

from ffdl.adapters.launchers.k8s_client import (
    NODES,
    PODS,
    KubeApiError,
    KubeClient,
    KubeObject,
    KubeUnreachableError,
    Resource,
    ResourceExpiredError,
)
from ffdl.adapters.launchers.k8s_manifests import (
    ANNOTATION_TENANT,
    ANY_JOB_SELECTOR,
    CONTAINER_NAME,
    GPU_RESOURCE,
    learner_of,
)
from ffdl.adapters.processes import exit_code_of
from ffdl.core.allocator import Node
from ffdl.core.kinds import JOBS
from ffdl.core.nodes import InventoryObservation
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import CommandData
from ffdl.events.ids import pod_ended_command_id, pod_saved_command_id
from ffdl.events.job_events import within_reason
from ffdl.events.model import Checkpoint, LossReason
from ffdl.handlers.aio import Backoff, sleep_or_stop, until_stopped
from ffdl.handlers.exit_records import saved_on_the_way_out
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import HeartbeatStore

log = structlog.get_logger(__name__)

Change = Literal["ADDED", "MODIFIED", "DELETED"]
OnChange = Callable[[Change, KubeObject], Awaitable[None]]

WATCH_TIMEOUT_S = 300
RETRY_MAX_S = 10.0
#: Container waiting reasons after which the learner will not start without a new attempt.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
UNKNOWN_GPU_TYPE = "unknown"


# --------------------------------------------------------------------------- informer


class Informer:
    """A local copy of one kind of object, kept current by list + watch; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        namespace: str | None,
        on_change: OnChange,
        *,
        label_selector: str = "",
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._on_change = on_change
        self._selector = label_selector
        self._watch_timeout_s = watch_timeout_s
        self.objects: dict[str, KubeObject] = {}
        self.synced = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the objects until ``stop``; relist after every break."""
        backoff = Backoff(0.2, RETRY_MAX_S)
        while not stop.is_set():
            try:
                await until_stopped(self._follow(backoff), stop)
            except ResourceExpiredError:
                log.info("watch resource version expired: relisting", resource=self._resource.plural)
            except (KubeUnreachableError, KubeApiError) as error:
                log.warning(
                    "kubernetes watch broke: relisting", resource=self._resource.plural, error=str(error)
                )
                await sleep_or_stop(stop, backoff.next_delay())

    async def _follow(self, backoff: Backoff) -> None:
        """List, then watch from the list's version; a list that came back is health: ``backoff`` resets."""
        items, version = await self._client.list(self._resource, self._namespace, self._selector)
        backoff.reset()
        await self._resync(items)
        self.synced.set()
        while True:
            stream = self._client.watch(
                self._resource,
                self._namespace,
                resource_version=version,
                label_selector=self._selector,
                timeout_s=self._watch_timeout_s,
            )
            async for event in stream:
                version = event.object.get("metadata", {}).get("resourceVersion") or version
                if event.type in ("ADDED", "MODIFIED", "DELETED"):
                    await self._apply(event.type, event.object)  # type: ignore[arg-type]

    async def _resync(self, items: Sequence[KubeObject]) -> None:
        listed = {item["metadata"]["name"]: item for item in items}
        for name in [name for name in self.objects if name not in listed]:
            await self._apply("DELETED", self.objects[name])
        for name, item in listed.items():
            known = self.objects.get(name)
            if known is None:
                await self._apply("ADDED", item)
            elif _version(known) != _version(item):
                await self._apply("MODIFIED", item)

    async def _apply(self, change: Change, obj: KubeObject) -> None:
        name = obj["metadata"]["name"]
        if change == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        await self._on_change(change, obj)


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


# --------------------------------------------------------------------------- pods


@dataclass(frozen=True, slots=True)
class PodObservation:
    """How a pod's status says its learner ended: it exited with a code, or it is lost (and why)."""

    kind: Literal["exited", "lost"]
    exit_code: int = 0
    detail: str = ""


def _learner_container(status: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = status.get("containerStatuses") or []
    for container in containers:
        if container.get("name") == CONTAINER_NAME:
            return dict(container)
    return dict(containers[0]) if containers else {}


def _memory_limit(pod: Mapping[str, Any]) -> str:
    for container in pod.get("spec", {}).get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            return str(container.get("resources", {}).get("limits", {}).get("memory", "unset"))
    return "unset"


def observe_pod(pod: Mapping[str, Any]) -> PodObservation | None:
    """How the pod's status says its learner ended (None: it has not, as far as the pod shows)."""
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    container = _learner_container(status)
    state = container.get("state") or {}
    terminated, waiting = state.get("terminated"), state.get("waiting")
    if phase == "Failed" and status.get("reason"):
        # A pod-level reason (Evicted, NodeLost, OutOfnvidia.com/gpu, ...) says more than the exit code.
        return PodObservation("lost", detail=f"{status['reason']}: {status.get('message', '')}".strip())
    if terminated:
        code = int(terminated.get("exitCode", 0))
        if terminated.get("reason") == "OOMKilled":
            detail = (
                f"OOMKilled: the learner ran out of memory (limit {_memory_limit(pod)}), exit code {code}"
            )
            return PodObservation("lost", detail=detail)
        return PodObservation("exited", exit_code=exit_code_of(code))
    if phase == "Succeeded":
        return PodObservation("exited", exit_code=0)
    if phase == "Failed":
        return PodObservation("lost", detail="Failed: the pod failed before its learner ran")
    if waiting and waiting.get("reason") in FATAL_WAITING_REASONS:
        return PodObservation("lost", detail=f"{waiting['reason']}: {waiting.get('message', '')}".strip())
    return None


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message while a pod is Pending because no node can take it, else None."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return None
    for condition in status.get("conditions") or []:
        scheduled = (condition.get("type"), condition.get("status"), condition.get("reason"))
        if scheduled == ("PodScheduled", "False", "Unschedulable"):
            return str(condition.get("message") or "no node can take the pod")
    return None


#: While the heartbeat store is not answering (its last read failed), how long a pod's end waits for
#: its exit record before it is reported without it. Pods are handled one after another, so each
#: would otherwise wait out the store's whole deadline: a halted gang of 64 pods, two minutes on a
#: frozen etcd. A read that answers in time ends the wait for the next pods.
QUIET_STORE_WAIT_S = 0.25


class PodWatcher:
    """Sends the owners of jobs what their learner pods show; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        sender: CommandSender,
        *,
        owns: Callable[[str], bool] = lambda job_id: True,
        pending_timeout_s: float = 60.0,
        check_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        heartbeats: HeartbeatStore | None = None,
    ) -> None:
        self._sender = sender
        self._owns = owns
        self._heartbeats = heartbeats  # where the learners' exit records are read (None: they are not)
        self._store_answers = True  # whether the last read of an exit record was answered
        self._pending_timeout_s = pending_timeout_s
        self._check_interval_s = check_interval_s
        self._clock = clock
        self.informer = Informer(
            client,
            PODS,
            namespace,
            self._on_pod,
            label_selector=ANY_JOB_SELECTOR,
            watch_timeout_s=watch_timeout_s,
        )
        self._ended: set[str] = set()  # uids of the pods whose learner's end was reported
        self._unschedulable_since: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        checker = asyncio.create_task(self._check_forever(stop))
        try:
            await self.informer.run(stop)
        finally:
            checker.cancel()
            await asyncio.gather(checker, return_exceptions=True)

    async def node_lost(self, node: str, detail: str) -> None:
        """Report every unfinished learner on ``node`` lost (its node went away or NotReady)."""
        for pod in list(self.informer.objects.values()):
            if pod.get("spec", {}).get("nodeName") == node and pod.get("status", {}).get("phase") in (
                "Pending",
                "Running",
            ):
                await self._report(pod, PodObservation("lost", detail=f"NodeLost: {detail}"))

    async def _saved(self, job_id: str, attempt: int, rank: int) -> list[Checkpoint]:
        """The checkpoint the learner's exit record names, if any; waiting at most
        :data:`QUIET_STORE_WAIT_S` for it while the store is not answering."""
        if self._heartbeats is None:
            return []
        saved: list[Checkpoint] | None
        try:
            async with asyncio.timeout(None if self._store_answers else QUIET_STORE_WAIT_S):
                saved = await saved_on_the_way_out(self._heartbeats, job_id, attempt, [rank])
        except TimeoutError:
            log.warning(
                "exit record unread: the heartbeat store is still not answering",
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                waited_s=QUIET_STORE_WAIT_S,
            )
            saved = None
        self._store_answers = saved is not None
        return saved or []

    # -- reactions ------------------------------------------------------------------------------

    async def _on_pod(self, change: Change, pod: KubeObject) -> None:
        uid = pod["metadata"].get("uid", pod["metadata"]["name"])
        if change == "DELETED":
            if uid not in self._ended and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                deleted = PodObservation(
                    "lost", detail="Deleted: the pod was deleted before its learner exited"
                )
                await self._report(pod, observe_pod(pod) or deleted, after_agent=True)
            self._ended.discard(uid)
            self._unschedulable_since.pop(uid, None)
            return
        if unschedulable_message(pod) is None:
            self._unschedulable_since.pop(uid, None)
        else:
            self._unschedulable_since.setdefault(uid, self._clock())
        observation = observe_pod(pod)
        if observation is not None:
            await self._report(pod, observation, after_agent=observation.kind == "exited")

    async def _check_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or_stop(stop, self._check_interval_s)
            try:
                await self._check_pending()
            except Exception:
                log.exception("pending pod check failed")

    async def _check_pending(self) -> None:
        now = self._clock()
        for pod in list(self.informer.objects.values()):
            uid = pod["metadata"].get("uid", pod["metadata"]["name"])
            since = self._unschedulable_since.get(uid)
            message = unschedulable_message(pod)
            if since is None or message is None or now - since < self._pending_timeout_s:
                continue
            detail = f"Unschedulable: {message} (pending for {now - since:.0f} s)"
            await self._report(pod, PodObservation("lost", detail=detail))

    async def _report(
        self, pod: Mapping[str, Any], observation: PodObservation, *, after_agent: bool = False
    ) -> None:
        """Send the learner's end; ``after_agent``: its agent may have written an exit record (its
        container ended, or its pod was deleted, as a halt does), so the checkpoint that names goes
        first. Not for a node lost or a pod that never ran: no record to read, and a read of a store
        that does not answer would hold up the report for the store's deadline."""
        handle = learner_of(pod)
        if handle is None or not self._owns(handle.job_id):
            return
        uid = pod["metadata"].get("uid", pod["metadata"]["name"])
        if uid in self._ended:
            return
        data: CommandData
        if observation.kind == "exited":
            data = cmd.ReportLearnerExited(
                rank=handle.rank, attempt=handle.attempt, exit_code=observation.exit_code
            )
        else:
            data = cmd.ReportLearnerLost(
                rank=handle.rank,
                attempt=handle.attempt,
                reason=LossReason.VANISHED,
                detail=within_reason(observation.detail),  # Kubernetes' messages have no bound
            )
        tenant = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_TENANT, "")
        address = JOBS.address(handle.job_id, tenant)
        saved = await self._saved(handle.job_id, handle.attempt, handle.rank) if after_agent else []
        command_id = pod_ended_command_id(uid)
        commands = [
            *(
                self._sender.make(
                    address, cmd.ReportCheckpoint(checkpoint=checkpoint), command_id=pod_saved_command_id(uid)
                )
                for checkpoint in saved
            ),
            self._sender.make(address, data, command_id=command_id),
        ]
        await self._sender.send(*commands)
        self._ended.add(uid)
        log.info(
            "learner pod observed",
            job_id=handle.job_id,
            attempt=handle.attempt,
            rank=handle.rank,
            pod=pod["metadata"]["name"],
            observation=observation.kind,
            exit_code=observation.exit_code if observation.kind == "exited" else None,
            detail=observation.detail or None,
            command_id=str(command_id),
        )


# --------------------------------------------------------------------------- nodes

_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("3920m", "16Gi", "1e3", "8") as a number."""
    text = text.strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, multiplier = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, multiplier = text, Decimal(1)
    try:
        return Decimal(number) * multiplier
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from None


def node_is_ready(node: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the node's Ready condition is True, and what it says otherwise."""
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            return ready, f"{condition.get('reason', '')}: {condition.get('message', '')}".strip(": ")
    return False, "the node reports no Ready condition"


def node_of(node: Mapping[str, Any], gpu_type_labels: Sequence[str]) -> Node:
    """A Kubernetes node as the scheduler's inventory sees it."""
    allocatable = node.get("status", {}).get("allocatable") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    gpu_type = next((labels[label] for label in gpu_type_labels if labels.get(label)), UNKNOWN_GPU_TYPE)
    return Node(
        name=node["metadata"]["name"],
        gpus=int(parse_quantity(str(allocatable.get(GPU_RESOURCE, "0")))),
        gpu_type=gpu_type,
        cpus=float(parse_quantity(str(allocatable.get("cpu", "0")))) or 0.001,
        memory_mb=int(parse_quantity(str(allocatable.get("memory", "0"))) / 2**20) or 1,
        schedulable=not node.get("spec", {}).get("unschedulable", False),
    )


class NodeInventory:
    """The cluster's nodes as an inventory source (see :class:`ffdl.handlers.ports.InventorySource`):
    Ready nodes are in it (``spec.unschedulable`` is the source's own cordon), NotReady ones are
    lost, deleted ones are gone. A node leaving the Ready ones also reports its learners lost."""

    SOURCE = "Kubernetes nodes"

    def __init__(
        self,
        client: KubeClient,
        *,
        gpu_type_labels: Sequence[str],
        on_node_lost: Callable[[str, str], Awaitable[None]] | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._gpu_type_labels = tuple(gpu_type_labels)
        self.on_node_lost = on_node_lost
        self._nodes: dict[str, Node] = {}
        self._not_ready: dict[str, str] = {}
        self.informer = Informer(client, NODES, None, self._on_node, watch_timeout_s=watch_timeout_s)

    def inventory(self) -> list[Node]:
        """The nodes that can run learners now (empty until the first list arrived)."""
        return sorted(self._nodes.values(), key=lambda node: node.name)

    def observe(self) -> InventoryObservation | None:
        if not self.informer.synced.is_set():
            return None
        return InventoryObservation(dict(self._nodes), dict(self._not_ready), self.SOURCE)

    async def run(self, stop: asyncio.Event) -> None:
        await self.informer.run(stop)

    async def _on_node(self, change: Change, node: KubeObject) -> None:
        name = node["metadata"]["name"]
        ready, condition = node_is_ready(node)
        was_there = name in self._nodes
        if change != "DELETED" and ready:
            self._nodes[name] = node_of(node, self._gpu_type_labels)
            self._not_ready.pop(name, None)
            if not was_there:
                log.info("node joined the inventory", node=name, gpus=self._nodes[name].gpus)
            return
        self._nodes.pop(name, None)
        if change == "DELETED":
            self._not_ready.pop(name, None)
            detail = f"node {name} was deleted"
        else:
            # the reason the scheduler records the node lost with: Kubernetes' message has no bound
            detail = within_reason(f"node {name} is NotReady ({condition})")
            self._not_ready[name] = detail
        if not was_there:
            return
        log.warning("node left the inventory: its learners are lost", node=name, detail=detail)
        if self.on_node_lost is not None:
            await self.on_node_lost(name, detail)
