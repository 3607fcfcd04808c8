"""The platform with ``FFDL_LAUNCHER=kubernetes`` end to end: kmock's API with the local kubelet
(tests/kube.py) runs the learner pods, a real etcd holds their heartbeats, and the HTTP API answers.
The cluster's nodes are the inventory, recorded as node events; a finished job leaves no pod,
service or policy behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from ffdl.wiring.config import KubeConfig, Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings
from tests.kube import (
    NAMESPACE,
    NETWORK_POLICIES,
    PODS,
    SERVICES,
    ApiServer,
    LocalKubelet,
    api_server,
    node_manifest,
    request_json,
)
from tests.services import EtcdServer, wait_until_async

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, str]]:
    async with api_server() as (api, url):
        await request_json(api, "POST", "/api/v1/nodes", node_manifest("gpu-node-1", gpus=2, gpu_type="A100"))
        kubelet = LocalKubelet(api, tmp_path / "kubelet")
        await kubelet.start()
        try:
            yield api, url
        finally:
            await kubelet.stop()


@pytest.fixture
def settings(tmp_path: Path, etcd_server: EtcdServer, cluster: tuple[ApiServer, str]) -> Settings:
    kube = KubeConfig(api_url=cluster[1], namespace=NAMESPACE, orphan_check_s=0.5)
    return fast_settings(
        tmp_path / "ffdl", heartbeats=etcd_server.url, launcher="kubernetes", kube=kube, nodes=None
    )


async def test_a_job_runs_as_pods_on_the_clusters_nodes_and_leaves_nothing_behind(
    platform: Platform, api: Api, cluster: tuple[ApiServer, str]
) -> None:
    kube_api, _ = cluster
    await wait_until_async(
        lambda: [(n["name"], n["status"]) for n in platform.projection.nodes()] == [("gpu-node-1", "READY")],
        10,
        what="the cluster's node recorded as a node event",
    )
    spec = {
        "name": "on-pods",
        "learners": 2,
        "gpus": 1,
        "gpu_type": "A100",
        "command": 'echo "hello from $RANK"',
    }

    job_id = await api.submit(yaml.safe_dump(spec))
    job = await api.wait(job_id, "COMPLETED", released=True)

    assert [learner["exit_code"] for learner in job["learners"]] == [0, 0]
    for resource in (PODS, SERVICES, NETWORK_POLICIES):
        assert kube_api.live(resource, NAMESPACE) == []


async def test_objects_of_a_job_the_platform_does_not_know_are_removed(
    platform: Platform, cluster: tuple[ApiServer, str]
) -> None:
    kube_api, _ = cluster
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "ffdl-forgotten",
            "labels": {"ffdl.io/job": "forgotten"},
            "annotations": {"ffdl.io/job-id": "forgotten"},
        },
        "spec": {"clusterIP": "None", "selector": {"ffdl.io/job": "forgotten"}},
    }
    await request_json(kube_api, "POST", f"/api/v1/namespaces/{NAMESPACE}/services", service)

    async def removed() -> bool:
        owned_partitions = platform.reactor is not None and platform.reactor.partitions
        return bool(owned_partitions) and kube_api.live(SERVICES, NAMESPACE) == []

    await wait_until_async(removed, 15, what="the orphaned service to be removed")
