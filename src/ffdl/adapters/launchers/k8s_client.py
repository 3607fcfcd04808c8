"""A small typed client for the parts of the Kubernetes REST API the launcher uses.

It rides on kubernetes-asyncio's ``ApiClient`` for everything that is hard to get right (kubeconfig
and in-cluster credentials, TLS, token refresh, the aiohttp transport), and speaks plain JSON: objects
are dicts exactly as the API serves them, which is what manifests are written in, what watch streams
carry and what the tests compare. The generated per-kind API classes are not used because their
watch helper opens an HTTP session of its own that it never closes, reads events with a line limit
that large objects (nodes) exceed, and retries a 410 Gone from the same version, which cannot succeed.

Idempotence lives here: :meth:`KubeClient.create` treats 409 AlreadyExists as success and answers
the object that exists; :meth:`KubeClient.delete` treats 404 as success. Failures to reach the API at
all are :class:`KubeUnreachableError` (a ``ConnectionError``), refusals are :class:`KubeApiError` with the
status code, and a watch from a version the API no longer holds raises :class:`ResourceExpiredError` so the
caller relists.

Concurrency: one ``KubeClient`` is shared by every task of a process (aiohttp pools the connections);
a watch holds one connection for as long as its iterator is consumed.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.configuration import Configuration

KubeObject = dict[str, Any]

REQUEST_TIMEOUT_S = 30.0
#: How long a watch's connection may stay silent beyond the server-side timeout it asked for.
WATCH_READ_SLACK_S = 30.0


@dataclass(frozen=True, slots=True)
class Resource:
    """A kind of object and where the API serves it."""

    api_path: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return self.api_path.removeprefix("/api/").removeprefix("/apis/")

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        parts = [self.api_path]
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.plural} are namespaced: a namespace is needed")
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


PODS = Resource("/api/v1", "pods", "Pod")
SERVICES = Resource("/api/v1", "services", "Service")
NETWORK_POLICIES = Resource("/apis/networking.k8s.io/v1", "networkpolicies", "NetworkPolicy")
SECRETS = Resource("/api/v1", "secrets", "Secret")
NODES = Resource("/api/v1", "nodes", "Node", namespaced=False)


class KubeUnreachableError(ConnectionError):
    """The API server cannot be reached (or did not answer in time)."""


class KubeApiError(Exception):
    """The API server refused a request; ``status`` is the HTTP status of its answer."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class ResourceExpiredError(KubeApiError):
    """410 Gone: the version a watch asked to resume from is no longer held; relist."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    object: KubeObject


def _error(status: int, body: bytes) -> KubeApiError:
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    return _status_error(status, answer)


def _status_error(status: int, answer: KubeObject) -> KubeApiError:
    reason = str(answer.get("reason") or "")
    message = str(answer.get("message") or "")
    if status == 410:
        return ResourceExpiredError(status, reason or "Expired", message)
    return KubeApiError(status, reason, message)


class KubeClient:
    """JSON requests to one API server; see the module docstring."""

    def __init__(self, api: ApiClient, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._api = api
        self._request_timeout_s = request_timeout_s

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeClient:
        """Credentials from ``kubeconfig`` (or ``~/.kube/config``), or the pod's service account
        when running in a cluster and no kubeconfig is named."""
        configuration = Configuration()
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            # kubernetes-asyncio leaves this one function unannotated.
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        return cls(ApiClient(configuration))

    @classmethod
    def at(cls, url: str) -> KubeClient:
        """An API served at ``url`` without credentials (``kubectl proxy``, an emulator)."""
        return cls(ApiClient(Configuration(host=url.rstrip("/"))))

    async def close(self) -> None:
        await self._api.close()

    # -- verbs ----------------------------------------------------------------------------------

    async def create(
        self, resource: Resource, namespace: str | None, body: KubeObject
    ) -> tuple[KubeObject, bool]:
        """Create ``body``, or answer the object of that name that exists already: (object, created)."""
        try:
            return await self._json("POST", resource.path(namespace), body=body), True
        except KubeApiError as error:
            if error.status != 409:
                raise
        name = body["metadata"]["name"]
        existing = await self.get(resource, namespace, name)
        if existing is None:  # deleted in between: a retry creates it
            raise KubeApiError(409, "AlreadyExists", f"{resource.kind} {name} exists but could not be read")
        return existing, False

    async def get(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None:
        try:
            return await self._json("GET", resource.path(namespace, name))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[KubeObject], str]:
        """Every object that matches, and the resource version to watch from."""
        query = [("labelSelector", label_selector)] if label_selector else []
        answer = await self._json("GET", resource.path(namespace), query=query)
        items = answer.get("items") or []
        return list(items), str(answer.get("metadata", {}).get("resourceVersion", ""))

    async def delete(
        self, resource: Resource, namespace: str | None, name: str, grace_s: int | None = None
    ) -> bool:
        """Delete one object (dependents in the background); False when there was none."""
        options: KubeObject = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        query = []
        if grace_s is not None:
            options["gracePeriodSeconds"] = grace_s
            query.append(("gracePeriodSeconds", str(grace_s)))
        try:
            await self._json("DELETE", resource.path(namespace, name), query=query, body=options)
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def watch(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        resource_version: str,
        label_selector: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version`` until the server ends the stream (after ``timeout_s``)."""
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._request_timeout_s, sock_read=timeout_s + WATCH_READ_SLACK_S
        )
        response = await self._send("GET", resource.path(namespace), query=query, timeout=timeout)
        try:
            if response.status >= 400:
                raise _error(response.status, await response.read())
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _watch_event(line)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeUnreachableError(f"watch of {resource.plural} broke: {error!r}") from error
        finally:
            response.release()

    # -- transport ------------------------------------------------------------------------------

    async def _json(
        self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (), body: KubeObject | None = None
    ) -> KubeObject:
        timeout = aiohttp.ClientTimeout(total=self._request_timeout_s)
        response = await self._send(method, path, query=query, body=body, timeout=timeout)
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeUnreachableError(f"{method} {path}: {error!r}") from error
        finally:
            response.release()
        if response.status >= 400:
            raise _error(response.status, data)
        answer = json.loads(data) if data else {}
        return cast(KubeObject, answer)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]],
        timeout: aiohttp.ClientTimeout,
        body: KubeObject | None = None,
    ) -> aiohttp.ClientResponse:
        try:
            response = await self._api.call_api(
                path,
                method,
                query_params=list(query),
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeUnreachableError(f"{method} {path}: {error!r}") from error
        return cast(aiohttp.ClientResponse, response)


def _watch_event(line: bytes) -> WatchEvent:
    event = json.loads(line)
    kind = str(event.get("type", ""))
    obj = event.get("object") or {}
    if kind == "ERROR":
        raise _status_error(int(obj.get("code") or 500), obj)
    return WatchEvent(kind, obj)
