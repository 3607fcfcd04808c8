"""etcd with authentication on, as the reference deployment runs it (a real etcd, its auth enabled).

The platform logs in with a root-role user and logs in again when its token expires; each job's
agents get a login of their own whose role covers only the job's learner and exit keys, from the
local launcher (handed to the agent, never to the command) and from the Kubernetes launcher (a Secret
the learner pods read); a learner holding its job's login can write neither another job's keys nor
the scheduler's leader key, and the login is gone once the job's learners are stopped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aetcd
import pytest
from aetcd import rpc

from ffdl.adapters.election_etcd import ElectionUnavailableError, EtcdElection, leader_key
from ffdl.adapters.heartbeats import EtcdCredentials, EtcdHeartbeatStore, EtcdJobUsers, exit_key, learner_key
from ffdl.adapters.launchers.k8s_client import KubeClient
from ffdl.adapters.launchers.k8s_manifests import PodSettings, login_secret_name, pod_name
from ffdl.adapters.launchers.kubernetes import KubernetesLauncher
from ffdl.adapters.launchers.local import LocalLauncher
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.heartbeat_keys import parse_exit
from ffdl.handlers.ports import LaunchRequest, StoreUnavailable
from tests.harness import PLATFORM_USER
from tests.kube import NAMESPACE, SECRETS, LocalKubelet, api_server, node_manifest, request_json
from tests.services import EtcdServer, wait_until_async

pytestmark = pytest.mark.integration

TOKEN_TTL_S = 2
ROOT = EtcdCredentials("root", "root-password")
WAIT_S = 20.0


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """An etcd whose auth is on, with a root user (the platform's) and 2 s auth tokens."""
    server = EtcdServer(auth_token_ttl_s=TOKEN_TTL_S)
    server.start()
    asyncio.run(enable_auth(server))
    yield server
    server.stop()


async def enable_auth(server: EtcdServer) -> None:
    async with aetcd.Client(server.host, server.port, timeout=5) as client:
        auth = rpc.AuthStub(client.channel)
        await auth.UserAdd(rpc.AuthUserAddRequest(name=ROOT.username, password=ROOT.password))
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=ROOT.username, role="root"))
        await auth.AuthEnable(rpc.AuthEnableRequest())


@pytest.fixture
async def users(etcd: EtcdServer) -> AsyncIterator[EtcdJobUsers]:
    job_users = EtcdJobUsers(etcd.host, etcd.port, ROOT)
    yield job_users
    await job_users.close()


@pytest.fixture
async def platform_store(etcd: EtcdServer) -> AsyncIterator[EtcdHeartbeatStore]:
    store = EtcdHeartbeatStore(etcd.host, etcd.port, credentials=ROOT)
    yield store
    await store.close()


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


async def test_without_a_login_nothing_can_be_written(etcd: EtcdServer) -> None:
    anonymous = EtcdHeartbeatStore(etcd.host, etcd.port)
    try:
        with pytest.raises(aetcd.ClientError):
            await anonymous.put(learner_key(new_job(), 0), b"{}")
    finally:
        await anonymous.close()


async def test_a_jobs_login_writes_its_own_learner_and_exit_keys_and_nothing_else(
    etcd: EtcdServer, users: EtcdJobUsers, platform_store: EtcdHeartbeatStore
) -> None:
    job, other = new_job(), new_job()
    username = await users.grant(job, "job-password")
    learner = EtcdHeartbeatStore(etcd.host, etcd.port, credentials=EtcdCredentials(username, "job-password"))
    try:
        lease = await learner.grant(5)
        await learner.put(learner_key(job, 0), b"{}", lease)
        await learner.put(exit_key(job, 1, 0), b'{"exit_code": 0}')
        assert await learner.keepalive(lease)
        await learner.revoke(lease)
        for forbidden in (learner_key(other, 0), exit_key(other, 1, 0), leader_key("scheduler")):
            with pytest.raises(aetcd.ClientError, match="permission denied"):
                await learner.put(forbidden, b"forged")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await learner.snapshot(f"/ffdl/jobs/{other}/")
    finally:
        await learner.close()
    assert (await platform_store.snapshot(exit_key(job, 1, 0))).values == {
        exit_key(job, 1, 0): b'{"exit_code": 0}'
    }


async def test_a_login_granted_again_takes_the_new_password_and_a_revoked_one_is_gone(
    etcd: EtcdServer, users: EtcdJobUsers
) -> None:
    job = new_job()
    username = await users.grant(job, "first")
    assert await users.grant(job, "second") == username
    assert not await logs_in(etcd, EtcdCredentials(username, "first"))
    assert await logs_in(etcd, EtcdCredentials(username, "second"))
    await users.revoke(job)
    await users.revoke(job)  # already gone: fine
    assert not await logs_in(etcd, EtcdCredentials(username, "second"))


async def logs_in(etcd: EtcdServer, credentials: EtcdCredentials) -> bool:
    client = aetcd.Client(etcd.host, etcd.port, username=credentials.username, password=credentials.password)
    try:
        await client.connect()
    except aetcd.ClientError:
        return False
    finally:
        await client.close()
    return True


async def test_the_platform_logs_in_again_once_its_token_expired(
    etcd: EtcdServer, users: EtcdJobUsers, platform_store: EtcdHeartbeatStore
) -> None:
    job, role = new_job(), f"role-{uuid.uuid4().hex[:8]}"
    election = EtcdElection(etcd.host, etcd.port, 5, credentials=ROOT)
    try:
        await platform_store.put(learner_key(job, 0), b"{}")
        assert await election.current_token(role) is None
        await users.grant(job, "before-expiry")
        # idle: every token expires (etcd looks for expired tokens once a second)
        await asyncio.sleep(TOKEN_TTL_S + 3)
        with pytest.raises(StoreUnavailable, match="token expired"):
            await platform_store.put(learner_key(job, 0), b"{}")
        await platform_store.put(learner_key(job, 0), b"{}")  # logged in again
        with pytest.raises(ElectionUnavailableError):
            await election.current_token(role)
        assert await election.current_token(role) is None  # logged in again
        await users.grant(job, "after-expiry")  # logs in again by itself
    finally:
        await election.close()


async def test_a_local_agent_reports_with_its_jobs_login_which_its_command_never_sees(
    tmp_path: Path, etcd: EtcdServer, users: EtcdJobUsers, platform_store: EtcdHeartbeatStore
) -> None:
    launcher = LocalLauncher(
        tmp_path / "learners", etcd.url, heartbeat_ttl_s=2, user=PLATFORM_USER, logins=users
    )
    job = new_job()
    try:
        await launcher.launch(launch_request(job, "env"))
        exit_record = await wait_for_exit_record(platform_store, job)
        assert parse_exit(exit_record).exit_code == 0
        output = launcher.log_path(job, 1, 0).read_text()
        assert "FFDL_HEARTBEATS_PASSWORD" not in output and "FFDL_HEARTBEATS_USERNAME" not in output
        await launcher.stop(job, 1.0)
        assert not await logs_in(etcd, EtcdCredentials(f"ffdl-job-{job}", "any"))
    finally:
        await launcher.close()


async def test_a_learner_pod_reports_with_its_jobs_login_from_the_jobs_secret(
    tmp_path: Path, etcd: EtcdServer, users: EtcdJobUsers, platform_store: EtcdHeartbeatStore
) -> None:
    settings = PodSettings(namespace=NAMESPACE, image="ffdl:test", heartbeats_url=etcd.url, heartbeat_ttl_s=2)
    job = new_job()
    async with api_server() as (api, url):
        await request_json(api, "POST", "/api/v1/nodes", node_manifest("node-a"))
        kubelet = LocalKubelet(api, tmp_path / "kubelet")
        await kubelet.start()
        client = KubeClient.at(url)
        launcher = KubernetesLauncher(client, settings, poll_interval_s=0.05, logins=users)
        try:
            await launcher.launch(launch_request(job, "true"))
            (secret,) = api.live(SECRETS, NAMESPACE)
            assert secret["metadata"]["name"] == login_secret_name(job)
            assert parse_exit(await wait_for_exit_record(platform_store, job)).exit_code == 0
            assert "password" not in kubelet.log_path(pod_name(job, 1, 0)).read_text().lower()
            await launcher.stop(job, 1.0)
            assert api.live(SECRETS, NAMESPACE) == []
            assert not await logs_in(etcd, EtcdCredentials(f"ffdl-job-{job}", "any"))
        finally:
            await client.close()
            await kubelet.stop()


def launch_request(job_id: str, command: str) -> LaunchRequest:
    spec = JobSpec(name="auth", command=command)
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a"),))
    return LaunchRequest(job_id, "acme", 1, spec, placement, resume_from=None)


async def wait_for_exit_record(store: EtcdHeartbeatStore, job_id: str) -> bytes:
    key = exit_key(job_id, 1, 0)

    async def reported() -> bool:
        return key in (await store.snapshot(key)).values

    await wait_until_async(reported, WAIT_S, what="the learner's exit record")
    return (await store.snapshot(key)).values[key]
