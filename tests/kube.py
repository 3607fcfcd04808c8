"""A Kubernetes API for tests: kmock's emulator with the apiserver behaviour the launcher relies on,
and a local kubelet that runs pods as processes on this machine (architecture §9: no cluster runs here).

:class:`ApiServer` is kmock's ``KubernetesEmulator`` (an in-memory API over real HTTP) with what a
real apiserver does and kmock leaves out, each done as the apiserver does it:

* ``watch=true`` and ``watch=True`` both start a watch (kubernetes-asyncio sends the latter, kmock
  recognises only the former);
* a created object gets its namespace (from the URL), a uid, a creation time and a resource version
  (kmock stores it exactly as sent, so it would never reach a namespaced watch), a pod ``Pending``;
* every change gets the next resource version; lists carry the current one, and a watch resumes
  after the version it names, or answers ``410 Gone`` when that version was compacted away
  (:meth:`ApiServer.compact`); label selectors filter lists and watches;
* deleting a pod that is bound to a node and still running is graceful: it gets a deletion
  timestamp and stays until its kubelet confirms the end (a delete with grace 0);
* deleting an object deletes its dependents (owner references), as the garbage collector does.

Test knobs: :meth:`ApiServer.watches_paused` ends every open watch and holds new ones back;
:meth:`ApiServer.holding` holds back the requests that match until its block ends.

:class:`LocalKubelet` plays the scheduler and the kubelet of one namespace. It binds a pending pod to
the node its node affinity names when a Node of that name exists (else marks it Unschedulable), then
runs the container's command line verbatim as a local process with the container's environment over
the image's ``PATH``, its output in a per-pod log, in a new session (the container). It reports the
container's states through the ``/status`` subresource as a kubelet does (Running, then Succeeded or
Failed with the exit code), signals only the container's first process on a graceful delete (SIGTERM;
the image's ``tini -g`` forwards it to the process group), kills every process of the session once the
grace is over, and then confirms the deletion. Volumes are not emulated: paths inside the pod's
mounts do not exist here, so learners under this kubelet must not write there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import kmock
from kmock import KubernetesEmulator, KubernetesError, KubernetesObjectNotFoundError, Request, Server
from kubernetes_asyncio.client import models as openapi_models

from ffdl.adapters.heartbeats import open_store
from ffdl.adapters.launchers.k8s_client import KubeClient
from ffdl.adapters.launchers.k8s_manifests import CHECKPOINT_DIR, PodSettings, pod_name
from ffdl.adapters.launchers.kubernetes import KubernetesLauncher
from ffdl.adapters.processes import wait_for_exit
from ffdl.handlers.ports import HeartbeatStore, Launcher

Obj = dict[str, Any]

PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
NETWORK_POLICIES = kmock.resource("networking.k8s.io", "v1", "networkpolicies")
SECRETS = kmock.resource("", "v1", "secrets")
SERVED_KINDS = (
    ("v1/pods", "Pod", True),
    ("v1/services", "Service", True),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True),
    ("v1/secrets", "Secret", True),
    ("v1/nodes", "Node", False),
)
NODES = kmock.resource("", "v1", "nodes")
NAMESPACE = "ffdl-test"
DEFAULT_POD_GRACE_S = 30
_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _has(key: str, labels: Mapping[str, str]) -> bool:
    return key in labels


def _lacks(key: str, labels: Mapping[str, str]) -> bool:
    return key not in labels


def _equals(key: str, value: str, labels: Mapping[str, str]) -> bool:
    return labels.get(key) == value


def _differs(key: str, value: str, labels: Mapping[str, str]) -> bool:
    return labels.get(key) != value


def _label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """The equality-based label selectors (``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, comma-joined)."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for term in (part.strip() for part in text.split(",")):
        if not term:
            continue
        if match := re.fullmatch(rf"({_LABEL_KEY})\s*!=\s*(\S*)", term):
            checks.append(functools.partial(_differs, match[1], match[2]))
        elif match := re.fullmatch(rf"({_LABEL_KEY})\s*==?\s*(\S*)", term):
            checks.append(functools.partial(_equals, match[1], match[2]))
        elif match := re.fullmatch(rf"!({_LABEL_KEY})", term):
            checks.append(functools.partial(_lacks, match[1]))
        elif re.fullmatch(_LABEL_KEY, term):
            checks.append(functools.partial(_has, term))
        else:
            raise KubernetesError(status=400, reason="BadRequest", message=f"unsupported selector {text!r}")
    return lambda labels: all(check(labels) for check in checks)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = obj.get("metadata", {}).get("labels") or {}
    return labels


@dataclass
class _Gate:
    matches: Callable[[Request], bool]
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class _Change:
    revision: int
    resource: kmock.resource
    namespace: str | None
    event: Obj


class _Recorder:
    """Stands in for kmock's per-resource event bus: every change goes into the server's history."""

    def __init__(self, server: ApiServer, resource: kmock.resource) -> None:
        self._server = server
        self._resource = resource

    async def put(self, event: Obj) -> None:
        await self._server.record(self._resource, event)


class _Recorders(dict[kmock.resource, _Recorder]):
    def __init__(self, server: ApiServer) -> None:
        super().__init__()
        self._server = server

    def __missing__(self, resource: kmock.resource) -> _Recorder:
        recorder = self[resource] = _Recorder(self._server, resource)
        return recorder


@attrs.define(kw_only=True)
class ApiServer(KubernetesEmulator):
    """kmock's emulator behaving as an apiserver does where the launcher depends on it (module docstring)."""

    _revision: int = attrs.field(default=0, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _history: list[_Change] = attrs.field(factory=list, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _watch_generation: int = attrs.field(default=0, init=False)
    _watches_open: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _gates: list[_Gate] = attrs.field(factory=list, init=False)
    _collectors: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, kind, namespaced in SERVED_KINDS:  # a cluster serves these before any object exists
            self.resources[key] = kmock.ResourceInfo(
                namespaced=namespaced, kind=kind, subresources={"status"}
            )
        self._buses = _Recorders(self)  # type: ignore[assignment]  # kmock only ever calls put()
        self._watches_open.set()

    # -- what tests use -------------------------------------------------------------------------

    def live(self, resource: kmock.resource, namespace: str | None = None) -> list[Obj]:
        """Every object of ``resource`` (in ``namespace``) that exists now."""
        return [
            copy.deepcopy(obj.raw)
            for (kind, where, _), obj in self.objects.items()
            if kind == resource and not obj.deleted and (namespace is None or where == namespace)
        ]

    def compact(self) -> None:
        """Forget the history so far: a watch from any version before the current one gets 410 Gone."""
        self._compacted = self._revision

    @contextlib.asynccontextmanager
    async def watches_paused(self) -> AsyncIterator[None]:
        """End every open watch and hold new ones back until the block ends."""
        self._watches_open.clear()
        self._watch_generation += 1
        async with self._changed:
            self._changed.notify_all()
        try:
            yield
        finally:
            self._watches_open.set()

    @contextlib.asynccontextmanager
    async def holding(self, matches: Callable[[Request], bool]) -> AsyncIterator[asyncio.Event]:
        """Hold back the requests ``matches`` picks until the block ends; the event: one arrived."""
        gate = _Gate(matches)
        self._gates.append(gate)
        try:
            yield gate.arrived
        finally:
            gate.released.set()
            self._gates.remove(gate)

    async def record(self, resource: kmock.resource, event: Obj) -> None:
        """Add a change to the history (a deletion gets a version of its own) and wake the watches."""
        obj = copy.deepcopy(event["object"])
        if event["type"] == "DELETED":
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._next_revision())
        revision = int(obj.get("metadata", {}).get("resourceVersion") or self._next_revision())
        namespace = obj.get("metadata", {}).get("namespace")
        self._history.append(_Change(revision, resource, namespace, {"type": event["type"], "object": obj}))
        async with self._changed:
            self._changed.notify_all()

    async def close_collectors(self) -> None:
        for task in self._collectors:
            task.cancel()
        await asyncio.gather(*self._collectors, return_exceptions=True)

    # -- the apiserver --------------------------------------------------------------------------

    def _next_revision(self) -> int:
        self._revision += 1
        return self._revision

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        watching = request.params.get("watch", "").lower() in ("true", "1")
        if request.method == kmock.method.GET and watching and request.action != kmock.action.WATCH:
            # kmock's request log and its reactions hold this very object: correct it in place.
            object.__setattr__(request, "action", kmock.action.WATCH)
        for gate in list(self._gates):
            if gate.matches(request):
                gate.arrived.set()
                await gate.released.wait()
        if request.action == kmock.action.DELETE and request.name is not None:
            async with self._write_lock:
                key = (request.resource, request.namespace, request.name)
                return aiohttp.web.json_response(await self._delete(key, _grace_period(request)))
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            async with self._write_lock:
                self._stamp(request)
                return await super()._handle(request)
        return await super()._handle(request)

    def _stamp(self, request: Request) -> None:
        """What the apiserver adds to a new object, and the new version of a changed one."""
        if not isinstance(request.data, dict):
            raise KubernetesError(status=415, reason="UnsupportedMediaType", message="JSON objects only")
        metadata = request.data.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._next_revision())
        if request.action != kmock.action.CREATE:
            return
        if request.namespace:
            metadata["namespace"] = request.namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now()
        metadata.setdefault("generation", 1)
        if request.resource == PODS:
            request.data.setdefault("status", {}).setdefault("phase", "Pending")

    async def _delete(self, key: tuple[kmock.resource, str | None, str], grace_s: int | None) -> Obj:
        if key not in self.objects or self.objects[key].deleted:
            raise KubernetesObjectNotFoundError()
        stored = self.objects[key]
        current = stored.raw
        spec, status, metadata = current.get("spec", {}), current.get("status", {}), current["metadata"]
        if grace_s is None:
            grace_s = int(spec.get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_S))
        running = status.get("phase") not in ("Succeeded", "Failed")
        if key[0] == PODS and spec.get("nodeName") and running and grace_s > 0:
            already = metadata.get("deletionGracePeriodSeconds")
            if already is None or grace_s < already:
                stamp = {"deletionTimestamp": now(), "deletionGracePeriodSeconds": grace_s}
                stamp["resourceVersion"] = str(self._next_revision())
                stored.patch({"metadata": stamp})
                await self.record(key[0], {"type": "MODIFIED", "object": stored.raw})
            return copy.deepcopy(stored.raw)
        stored.delete()
        await self.record(key[0], {"type": "DELETED", "object": current})
        collector = asyncio.create_task(self._collect_dependents(metadata["uid"], key[1]))
        self._collectors.add(collector)
        collector.add_done_callback(self._collectors.discard)
        return current

    async def _collect_dependents(self, owner_uid: str, namespace: str | None) -> None:
        """The garbage collector: delete what the deleted object owned (pods with their own grace)."""
        async with self._write_lock:
            for key, stored in list(self.objects.items()):
                if stored.deleted or key[1] != namespace:
                    continue
                owners = stored.raw.get("metadata", {}).get("ownerReferences") or []
                if any(owner.get("uid") == owner_uid for owner in owners):
                    await self._delete(key, None)

    async def _serve_list(self, request: Request) -> Obj:
        assert request.resource is not None  # only Kubernetes requests reach the fallbacks
        matches = _label_selector(request.params.get("labelSelector", ""))
        items = [obj for obj in self.live(request.resource, request.namespace) if matches(_labels(obj))]
        return {
            "kind": "List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    async def _serve_watch(self, request: Request) -> AsyncIterator[Any]:
        yield b""  # the headers go out at once: the stream is open even if nothing happens
        assert request.resource is not None  # only Kubernetes requests reach the fallbacks
        await self._watches_open.wait()
        generation = self._watch_generation
        matches = _label_selector(request.params.get("labelSelector", ""))
        timeout_s = float(request.params.get("timeoutSeconds") or 0) or None
        deadline = asyncio.get_running_loop().time() + timeout_s if timeout_s else None
        since = request.params.get("resourceVersion", "")
        if since not in ("", "0") and int(since) < self._compacted:
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 410,
                "reason": "Expired",
            }
            yield {"type": "ERROR", "object": {**gone, "message": f"too old resource version: {since}"}}
            return
        if since in ("", "0"):
            position = self._revision
            for obj in self.live(request.resource, request.namespace):
                if matches(_labels(obj)):
                    yield {"type": "ADDED", "object": obj}
        else:
            position = int(since)
        while generation == self._watch_generation:
            for change in [change for change in self._history if change.revision > position]:
                position = max(position, change.revision)
                same_place = request.namespace is None or change.namespace == request.namespace
                if (
                    change.resource == request.resource
                    and same_place
                    and matches(_labels(change.event["object"]))
                ):
                    yield change.event
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return
            async with self._changed:
                if generation != self._watch_generation or (
                    self._history[-1:] and self._history[-1].revision > position
                ):
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)


def _grace_period(request: Request) -> int | None:
    raw = request.params.get("gracePeriodSeconds")
    if raw is None and isinstance(request.data, dict):
        raw = request.data.get("gracePeriodSeconds")
    return None if raw is None else int(raw)


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[tuple[ApiServer, str]]:
    """An :class:`ApiServer` on a free loopback port, and its URL."""
    async with ApiServer() as api, Server(api) as server:
        try:
            yield api, str(server.url).rstrip("/")
        finally:
            await api.close_collectors()


def node_manifest(name: str, gpus: int = 8, gpu_type: str = "A100", *, ready: bool = True) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "ffdl.io/gpu-type": gpu_type}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "Unknown", "reason": "KubeletReady"}
            ],
        },
    }


async def request_json(api: ApiServer, method: str, path: str, body: Obj | None = None) -> Obj:
    """One request to the API over HTTP, as a kubelet or kubectl makes it; raises on an error status."""
    async with api.request(method, path, json=body) as response:
        answer: Obj = await response.json()
        if response.status >= 400:
            raise RuntimeError(f"{method} {path}: {response.status} {answer}")
        return answer


async def patch_pod_status(api: ApiServer, name: str, status: Obj, namespace: str = NAMESPACE) -> Obj:
    return await request_json(
        api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}
    )


def running_status(node: str = "node-a") -> Obj:
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": now(),
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "learner",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "image": "ffdl:test",
                "imageID": "",
                "state": {"running": {"startedAt": now()}},
            }
        ],
    }


def terminated_status(exit_code: int, reason: str = "") -> Obj:
    reason = reason or ("Completed" if exit_code == 0 else "Error")
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": "learner",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "image": "ffdl:test",
                "imageID": "",
                "state": {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now()}},
            }
        ],
    }


# --------------------------------------------------------------------------- OpenAPI validation

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


def openapi_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Where a manifest departs from the Kubernetes OpenAPI schema as kubernetes-asyncio models it:
    unknown fields, wrong types, missing required fields."""
    version = str(manifest.get("apiVersion", "")).rsplit("/", 1)[-1]
    model = f"{version[:1].upper()}{version[1:]}{manifest.get('kind', '')}"
    if not hasattr(openapi_models, model):
        return [f"no Kubernetes model for {manifest.get('apiVersion')} {manifest.get('kind')}"]
    problems: list[str] = []
    _build(model, manifest, str(manifest.get("kind")), problems)
    return problems


def _build(type_name: str, value: Any, path: str, problems: list[str]) -> Any:
    """``value`` as an instance of ``type_name`` (its constructor checks required fields and enums)."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return None
        inner = type_name[5:-1]
        return [_build(inner, item, f"{path}[{index}]", problems) for index, item in enumerate(value)]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return None
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        return {key: _build(inner, item, f"{path}.{key}", problems) for key, item in value.items()}
    if type_name == "object":
        return value
    if type_name in _PRIMITIVES:
        wrong_bool = isinstance(value, bool) and type_name != "bool"
        if not isinstance(value, _PRIMITIVES[type_name]) or wrong_bool:
            problems.append(f"{path}: expected {type_name}, got {value!r}")
        return value
    model = getattr(openapi_models, type_name)
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a {type_name} object, got {type(value).__name__}")
        return None
    fields = {json_name: attribute for attribute, json_name in model.attribute_map.items()}
    arguments = {}
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}: unknown field {key!r} in {type_name}")
            continue
        attribute = fields[key]
        arguments[attribute] = _build(model.openapi_types[attribute], item, f"{path}.{key}", problems)
    try:
        return model(**arguments)
    except (TypeError, ValueError) as error:
        problems.append(f"{path}: {error}")
        return None


# --------------------------------------------------------------------------- the local kubelet


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == session and fields[0] not in "ZX":
            members.append(int(entry.name))
    return members


def _kill_session(session: int) -> None:
    """What a container runtime does to a container: SIGKILL every process in it."""
    for pid in _session_members(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start_container(
    spec: Obj, environment: Mapping[str, str], workdir: Path, log: Path
) -> subprocess.Popen[bytes]:
    """The container's command line, verbatim, in a new session: the container's processes."""
    with log.open("ab") as output:
        return subprocess.Popen(
            [*spec.get("command", []), *spec.get("args", [])],
            env=environment,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@dataclass
class _Container:
    process: subprocess.Popen[bytes]
    waiter: asyncio.Task[None] | None = None
    killer: asyncio.Task[None] | None = None
    terminating: bool = False


class LocalKubelet:
    """The scheduler and the kubelet of one namespace, running pods as local processes (module docstring)."""

    def __init__(self, api: ApiServer, root: Path, namespace: str = NAMESPACE) -> None:
        self._api = api
        self._root = root
        self._namespace = namespace
        bin_dir = Path(sys.executable).parent
        # The "image" holds the ffdl under test: the test's interpreter and import path.
        python_path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
        self._image_env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", **python_path}
        self._containers: dict[str, _Container] = {}
        self._handled: set[str] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        if shutil.which("tini") is None:
            raise RuntimeError("the local kubelet runs learner pods under tini: install Debian's tini")

    def log_path(self, pod: str) -> Path:
        return self._root / "logs" / f"{pod}.log"

    async def start(self) -> None:
        (self._root / "logs").mkdir(parents=True, exist_ok=True)
        self._watcher = asyncio.create_task(self._watch())
        await asyncio.wait_for(self._ready.wait(), 10)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        for container in self._containers.values():
            _kill_session(container.process.pid)
            for task in (container.waiter, container.killer):
                if task is not None:
                    task.cancel()
        for container in self._containers.values():
            await wait_for_exit(container.process)
            tasks = [task for task in (container.waiter, container.killer) if task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/pods?watch=true"
        while True:
            async with self._api.get(path, timeout=aiohttp.ClientTimeout(total=None)) as response:
                self._ready.set()
                async for line in response.content:
                    if line.strip():
                        event = json.loads(line)
                        await self._on_pod(event["type"], event["object"])

    async def _on_pod(self, kind: str, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        container = self._containers.get(name)
        if kind == "DELETED":
            if container is not None and container.process.poll() is None:
                _kill_session(container.process.pid)  # force-deleted: the kubelet kills what is left
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self._terminate(name, pod, container)
        elif not pod["spec"].get("nodeName"):
            await self._schedule(name, pod)
        elif name not in self._handled:
            self._handled.add(name)
            await self._run(name, pod)

    async def _schedule(self, name: str, pod: Obj) -> None:
        terms = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
        terms = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
        wanted = {
            value for term in terms for field_ in term.get("matchFields", []) for value in field_["values"]
        }
        nodes = {node["metadata"]["name"]: node for node in self._api.live(NODES)}
        fitting = sorted(
            n for n in wanted if n in nodes and not nodes[n].get("spec", {}).get("unschedulable")
        )
        base = f"/api/v1/namespaces/{self._namespace}/pods/{name}"
        if fitting:
            await request_json(self._api, "PATCH", base, {"spec": {"nodeName": fitting[0]}})
            return
        unschedulable = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/{len(nodes)} nodes are available: node(s) didn't match Pod's node affinity.",
        }
        await request_json(self._api, "PATCH", f"{base}/status", {"status": {"conditions": [unschedulable]}})

    async def _run(self, name: str, pod: Obj) -> None:
        (spec,) = pod["spec"]["containers"]
        environment = {**self._image_env, **{item["name"]: self._value(item) for item in spec.get("env", [])}}
        workdir = self._root / "pods" / name
        workdir.mkdir(parents=True, exist_ok=True)
        process = _start_container(spec, environment, workdir, self.log_path(name))
        container = self._containers[name] = _Container(process)
        await patch_pod_status(self._api, name, running_status(pod["spec"]["nodeName"]), self._namespace)
        container.waiter = asyncio.create_task(self._wait(name, container))

    def _value(self, variable: Obj) -> str:
        """A variable's value: as written, or from a key of a Secret of the namespace (base64 in it)."""
        if "value" in variable:
            return str(variable["value"])
        reference = variable["valueFrom"]["secretKeyRef"]
        (secret,) = [
            secret
            for secret in self._api.live(SECRETS, self._namespace)
            if secret["metadata"]["name"] == reference["name"]
        ]
        return base64.b64decode(secret["data"][reference["key"]]).decode()

    async def _wait(self, name: str, container: _Container) -> None:
        returncode = await wait_for_exit(container.process)
        _kill_session(container.process.pid)  # the container ends with its first process
        if container.killer is not None:
            container.killer.cancel()
        exit_code = returncode if returncode >= 0 else 128 - returncode
        path = f"/api/v1/namespaces/{self._namespace}/pods/{name}/status"
        async with self._api.patch(path, json={"status": terminated_status(exit_code)}) as response:
            if response.status not in (200, 404):  # 404: deleted meanwhile, nothing left to report to
                raise RuntimeError(
                    f"reporting the end of pod {name}: {response.status} {await response.text()}"
                )
        if container.terminating:
            await self._confirm_deletion(name)

    async def _terminate(self, name: str, pod: Obj, container: _Container | None) -> None:
        if container is None or container.process.poll() is not None:
            await self._confirm_deletion(name)
            return
        if container.terminating:
            return
        container.terminating = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(container.process.pid, signal.SIGTERM)
        grace_s = float(pod["metadata"].get("deletionGracePeriodSeconds", DEFAULT_POD_GRACE_S))

        async def kill_after_grace() -> None:
            await asyncio.sleep(grace_s)
            _kill_session(container.process.pid)

        container.killer = asyncio.create_task(kill_after_grace())

    async def _confirm_deletion(self, name: str) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/pods/{name}?gracePeriodSeconds=0"
        async with self._api.delete(path) as response:
            if response.status not in (200, 404):
                raise RuntimeError(f"deleting pod {name}: {response.status} {await response.text()}")


# --------------------------------------------------------------------------- the launcher rig

RIG_NODES = ("node-a", "node-b", "n")
HEARTBEAT_TTL_S = 2.0
CLEANUP_GRACE_S = 1.0


class KubernetesRig:
    """The launcher contract's rig for the Kubernetes launcher: kmock's API, the local kubelet, and
    an embedded heartbeat store that the learners' agents (local processes here) report to."""

    def __init__(self, api: ApiServer, url: str, kubelet: LocalKubelet, heartbeats_url: str) -> None:
        self.api = api
        self.url = url
        self.kubelet = kubelet
        self.settings = PodSettings(
            namespace=NAMESPACE,
            image="ffdl:test",
            heartbeats_url=heartbeats_url,
            heartbeat_ttl_s=HEARTBEAT_TTL_S,
        )
        self._store = open_store(heartbeats_url)
        self._clients: list[KubeClient] = []
        self._launchers = [self.new_launcher()]

    def new_launcher(self) -> KubernetesLauncher:
        client = KubeClient.at(self.url)
        self._clients.append(client)
        return KubernetesLauncher(client, self.settings, stop_slack_s=5.0, poll_interval_s=0.05)

    @property
    def launcher(self) -> KubernetesLauncher:
        return self._launchers[-1]

    @property
    def store(self) -> HeartbeatStore:
        return self._store

    async def restart_launcher(self) -> Launcher:
        await self.launcher.close()
        self._launchers.append(self.new_launcher())
        return self.launcher

    def visible_devices(self, gpus: tuple[int, ...]) -> str:
        """The device plugin gives the container exactly its GPUs, numbered from 0 inside it."""
        return ",".join(str(index) for index in range(len(gpus)))

    def checkpoint_dir(self, job_id: str) -> str:
        return CHECKPOINT_DIR

    async def learner_output(self, job_id: str, attempt: int, rank: int) -> str:
        path = self.kubelet.log_path(pod_name(job_id, attempt, rank))
        return path.read_text(errors="replace") if path.exists() else ""

    async def shutdown(self) -> None:
        for job_id in {handle.job_id for handle in await self.launcher.running()}:
            await self.launcher.stop(job_id, CLEANUP_GRACE_S)
        for launcher in self._launchers:
            await launcher.close()
        for client in self._clients:
            await client.close()
        await self._store.close()


@contextlib.asynccontextmanager
async def kubernetes_rig(tmp_path: Path) -> AsyncIterator[KubernetesRig]:
    async with api_server() as (api, url):
        for node in RIG_NODES:
            await request_json(api, "POST", "/api/v1/nodes", node_manifest(node))
        kubelet = LocalKubelet(api, tmp_path / "kubelet")
        await kubelet.start()
        rig = KubernetesRig(api, url, kubelet, f"embedded://{tmp_path / 'heartbeats.sqlite'}")
        try:
            yield rig
        finally:
            try:
                await rig.shutdown()
            finally:
                await kubelet.stop()
