"""The Kubernetes launcher: every learner is a bare pod, created through the API (architecture §6).

``launch`` makes the job's headless Service (rendezvous), its NetworkPolicy, where the heartbeat
store authenticates the job's heartbeat login (a Secret with its password, and the login itself in
the store) and one pod per learner (see :mod:`ffdl.adapters.launchers.k8s_manifests`). It is
idempotent by name: every object has a name fixed by job id, attempt and rank, and
``409 AlreadyExists`` counts as done, so a launch that is repeated, raced by a second launch, or
resumed by a restarted platform after it crashed halfway completes the one set of pods instead of
making a second. The API server is the launcher's whole memory: ``running`` and ``stop`` work from
what it lists, whoever made the pods.

``stop`` deletes the job's pods (every attempt) with the grace period: the kubelet sends SIGTERM,
and SIGKILL once the grace is over. It waits until the pods are gone, then removes the job's
heartbeat login, the Secret, the NetworkPolicy and the Service. A pod that outlives its grace by
``stop_slack_s`` (its node no longer answers) is force-deleted, so a stop always ends. Owner
references make the Service the owner of everything else, so deleting it by hand (or a stop cut
short) still removes the whole job.

:meth:`KubernetesLauncher.remove_orphans` is the reconciler FfDL lacked: it removes the objects of
jobs that should have no learners (ended, halted, or unknown).

:class:`KubernetesCluster` is what the platform runs when learners are pods: this launcher, the pod
watcher and the node inventory of :mod:`ffdl.adapters.launchers.k8s_watch`, and the periodic orphan
removal, all over one API client.

Concurrency: one asyncio lock per job serialises ``launch``, ``stop`` and orphan removal of that
job within this process (a stop waiting out its grace holds up no other job); across processes the
API server's create-if-absent is the arbiter. ``close`` leaves the pods running, for a restarted
platform to adopt; the :class:`~ffdl.adapters.launchers.k8s_client.KubeClient` belongs to whoever
opened it.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from ffdl.adapters.launchers.k8s_client import (
    NETWORK_POLICIES,
    PODS,
    SECRETS,
    SERVICES,
    KubeApiError,
    KubeClient,
    KubeObject,
    KubeUnreachableError,
    Resource,
)
from ffdl.adapters.launchers.k8s_manifests import (
    ANY_JOB_SELECTOR,
    PodLogin,
    PodSettings,
    job_id_of,
    learner_of,
    login_password,
    login_secret_manifest,
    login_secret_name,
    network_policy_manifest,
    pod_manifest,
    service_manifest,
    service_name,
)
from ffdl.adapters.launchers.k8s_watch import NodeInventory, PodWatcher
from ffdl.adapters.launchers.kube_config import KubeConfig
from ffdl.adapters.launchers.logins import HeartbeatLogins, new_password
from ffdl.handlers.aio import sleep_or_stop
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import HeartbeatStore, LaunchRequest, LearnerHandle

log = structlog.get_logger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
STOP_SLACK_S = 30.0
STOP_POLL_INTERVAL_S = 0.2


def pod_finished(pod: KubeObject) -> bool:
    return pod.get("status", {}).get("phase") in FINISHED_PHASES


class KubernetesLauncher:
    """A :class:`~ffdl.handlers.ports.Launcher` that runs learners as pods; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        settings: PodSettings,
        *,
        stop_slack_s: float = STOP_SLACK_S,
        poll_interval_s: float = STOP_POLL_INTERVAL_S,
        logins: HeartbeatLogins | None = None,
    ) -> None:
        self._client = client
        self._logins = logins
        self.settings = settings
        self._namespace = settings.namespace
        self._stop_slack_s = stop_slack_s
        self._poll_interval_s = poll_interval_s
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # -- the port -------------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> None:
        async with self._job_lock(request.job_id):
            settings = self.settings
            service, _ = await self._create(
                SERVICES, service_manifest(request.job_id, request.tenant, settings), request.job_id
            )
            await self._create(
                NETWORK_POLICIES,
                network_policy_manifest(request.job_id, request.tenant, service, settings),
                request.job_id,
            )
            login = await self._login(request, service)
            created = 0
            for learner in request.placement.learners:
                pod = pod_manifest(request, learner, service, settings, login)
                _, made = await self._create(PODS, pod, request.job_id)
                created += made
            log.info(
                "learner pods launched",
                job_id=request.job_id,
                attempt=request.attempt,
                created=created,
                existing=len(request.placement.learners) - created,
            )

    async def stop(self, job_id: str, grace_s: float) -> None:
        async with self._job_lock(job_id):
            await self._stop(job_id, grace_s)

    async def running(self) -> list[LearnerHandle]:
        pods, _ = await self._client.list(PODS, self._namespace, ANY_JOB_SELECTOR)
        alive = [handle for pod in pods if not pod_finished(pod) and (handle := learner_of(pod)) is not None]
        return sorted(alive, key=lambda handle: (handle.job_id, handle.attempt, handle.rank))

    async def close(self) -> None:
        """Nothing to release: the pods run on, for a restarted platform to adopt."""

    # -- reconciling ----------------------------------------------------------------------------

    async def remove_orphans(self, is_live: Callable[[str], bool], grace_s: float) -> list[str]:
        """Stop and remove the objects of every job that ``is_live`` disowns; returns those job ids.

        ``is_live`` answers True for a job that may have learners now, and for a job this process
        does not judge (another platform instance owns it); it is asked again under the job's lock,
        so a job that went live meanwhile keeps its learners.
        """
        found: set[str] = set()
        for resource in (PODS, SERVICES):
            objects, _ = await self._client.list(resource, self._namespace, ANY_JOB_SELECTOR)
            found.update(job_id for obj in objects if (job_id := job_id_of(obj)) is not None)
        orphans = sorted(job_id for job_id in found if not is_live(job_id))

        async def remove(job_id: str) -> bool:
            async with self._job_lock(job_id):
                if is_live(job_id):
                    return False
                log.warning("removing the learners of a job that should have none", job_id=job_id)
                await self._stop(job_id, grace_s)
                return True

        removed = await asyncio.gather(*(remove(job_id) for job_id in orphans))
        return [job_id for job_id, done in zip(orphans, removed, strict=True) if done]

    # -- steps ----------------------------------------------------------------------------------

    async def _create(self, resource: Resource, body: KubeObject, job_id: str) -> tuple[KubeObject, bool]:
        """Create ``body`` for the job, or take the object of that name if it is the job's own (a
        repeated launch); one of another job's is refused, and never used or changed."""
        obj, created = await self._client.create(resource, self._namespace, body)
        if not created and job_id_of(obj) != job_id:
            raise ValueError(f"the {resource.kind} name {body['metadata']['name']} is another job's")
        return obj, created

    async def _pods(self, job_id: str) -> list[KubeObject]:
        """The job's pods, by the annotation that holds its exact id: a label is shortened past 63
        characters, and another job's may be the same."""
        pods, _ = await self._client.list(PODS, self._namespace, ANY_JOB_SELECTOR)
        return [pod for pod in pods if job_id_of(pod) == job_id]

    async def _stop(self, job_id: str, grace_s: float) -> None:
        pods = await self._pods(job_id)
        grace = math.ceil(max(grace_s, 0.0))
        for pod in pods:
            # A finished pod has nothing left to stop: it goes at once.
            await self._client.delete(
                PODS, self._namespace, pod["metadata"]["name"], 0 if pod_finished(pod) else grace
            )
        remaining = await self._wait_until_gone(job_id, grace + self._stop_slack_s)
        if remaining:
            log.warning(
                "learner pods outlived their grace: force-deleting them (their node does not answer)",
                job_id=job_id,
                pods=remaining,
            )
            for name in remaining:
                await self._client.delete(PODS, self._namespace, name, 0)
        if self._logins is not None:
            await self._logins.revoke(job_id)
        owned = [(NETWORK_POLICIES, service_name(job_id)), (SERVICES, service_name(job_id))]
        if self._logins is not None:
            owned.insert(0, (SECRETS, login_secret_name(job_id)))
        for resource, name in owned:  # by name (no list of secrets granted), if the job's own
            obj = await self._client.get(resource, self._namespace, name)
            if obj is not None and job_id_of(obj) == job_id:
                await self._client.delete(resource, self._namespace, name)
        log.info("learner pods stopped", job_id=job_id, pods=len(pods), grace_s=grace_s)

    async def _login(self, request: LaunchRequest, service: Mapping[str, Any]) -> PodLogin | None:
        """The job's heartbeat login, if the store authenticates: one password per job, kept in the
        job's Secret (an existing Secret's password is kept, so a repeated launch changes nothing)."""
        if self._logins is None:
            return None
        manifest = login_secret_manifest(
            request.job_id, request.tenant, service, self.settings, new_password()
        )
        secret, _ = await self._create(SECRETS, manifest, request.job_id)
        username = await self._logins.grant(request.job_id, login_password(secret))
        return PodLogin(username, secret["metadata"]["name"])

    async def _wait_until_gone(self, job_id: str, timeout_s: float) -> list[str]:
        """Wait until the job has no pod left; returns the names of those still there at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            pods = await self._pods(job_id)
            if not pods or time.monotonic() >= deadline:
                return sorted(pod["metadata"]["name"] for pod in pods)
            await asyncio.sleep(self._poll_interval_s)

    def _job_lock(self, job_id: str) -> asyncio.Lock:
        """The lock that serialises launching and stopping one job (held locks stay in the map)."""
        lock = self._locks.get(job_id)
        if lock is None:
            lock = self._locks[job_id] = asyncio.Lock()
        return lock


class KubernetesCluster:
    """The launcher, the pod watcher, the node inventory and the orphan removal over one API client."""

    def __init__(
        self,
        client: KubeClient,
        kube: KubeConfig,
        *,
        heartbeats_url: str,
        heartbeat_ttl_s: float,
        stop_grace_s: float,
        logins: HeartbeatLogins | None = None,
    ) -> None:
        if not heartbeats_url.startswith("etcd://"):
            raise ValueError(
                "learner pods report to the heartbeat store over the network: the kubernetes launcher "
                f"needs FFDL_HEARTBEATS=etcd://HOST:PORT that the pods reach, not {heartbeats_url}"
            )
        self.client = client
        self._kube = kube
        self._stop_grace_s = stop_grace_s
        self.pod_settings = PodSettings(
            namespace=kube.namespace,
            image=kube.image,
            heartbeats_url=heartbeats_url,
            heartbeat_ttl_s=heartbeat_ttl_s,
            rendezvous_port=kube.rendezvous_port,
            cluster_domain=kube.cluster_domain,
            service_account=kube.service_account,
            storage_claim=kube.storage_claim,
            run_as_user=kube.run_as_user,
            scratch_limit_mb=kube.scratch_limit_mb,
            termination_grace_s=math.ceil(stop_grace_s),
            gpu_type_labels=tuple(kube.gpu_type_labels),
            dns_peer=kube.dns_peer,
            heartbeats_peer=kube.heartbeats_peer,
            extra_egress=tuple(kube.learner_egress),
        )
        self.launcher = KubernetesLauncher(client, self.pod_settings, logins=logins)
        self.nodes = NodeInventory(client, gpu_type_labels=kube.gpu_type_labels)

    @staticmethod
    async def client_for(kube: KubeConfig) -> KubeClient:
        """A client of the API server ``kube`` names (a proxy URL, a kubeconfig, or in-cluster)."""
        if kube.api_url:
            return KubeClient.at(kube.api_url)
        return await KubeClient.connect(kube.kubeconfig, kube.context)

    def pod_watcher(
        self, sender: CommandSender, owns: Callable[[str], bool], heartbeats: HeartbeatStore | None = None
    ) -> PodWatcher:
        """The watcher of the learner pods of the jobs ``owns`` picks; it also hears of lost nodes,
        and reads the learners' exit records in ``heartbeats``."""
        watcher = PodWatcher(
            self.client,
            self.pod_settings.namespace,
            sender,
            owns=owns,
            pending_timeout_s=self._kube.pending_timeout_s,
            heartbeats=heartbeats,
        )
        self.nodes.on_node_lost = watcher.node_lost
        return watcher

    async def remove_orphans_forever(self, is_live: Callable[[str], bool], stop: asyncio.Event) -> None:
        """Every ``orphan_check_s``, remove the learners of jobs that should have none."""
        every_s = self._kube.orphan_check_s
        while not await sleep_or_stop(stop, every_s):
            try:
                await self.launcher.remove_orphans(is_live, self._stop_grace_s)
            except (KubeUnreachableError, KubeApiError) as error:
                log.warning("orphan check failed: trying again later", error=str(error))

    async def close(self) -> None:
        await self.client.close()
