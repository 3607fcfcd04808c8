"""A job's network namespace: its learners meet on its loopback, nobody else gets in, and it goes
with the job. Real namespaces (``ip netns``, as root) and real sandboxes (bwrap); the platform runs
them end to end in ``tests/e2e/test_hostile_learner.py``."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest

from ffdl.adapters.launchers import job_network
from ffdl.adapters.launchers.sandbox import LearnerPlaces, Sandbox, SandboxUnavailable
from tests.services import wait_until_async

pytestmark = pytest.mark.skipif(
    job_network.probe() is not None, reason=f"no network namespaces here: {job_network.probe()}"
)

#: A learner that listens on the loopback and says its port, then answers one connection.
LISTEN = (
    "import socket; s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True); "
    "c, _ = s.accept(); c.sendall(b'hello'); c.close()"
)
#: A learner that connects to PORT on the loopback and prints what it got, or why it got nothing.
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    print(socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2).recv(5).decode())\n"
    "except OSError as error:\n"
    "    print(type(error).__name__)\n"
)


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@pytest.fixture
async def jobs() -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    for job_id in made:
        await job_network.remove(job_id)


def sandboxed(tmp_path: Path, job_id: str, *command: str) -> list[str]:
    """The command line of one learner of ``job_id`` in its sandbox, in its job's namespace."""
    work = tmp_path / job_id
    work.mkdir(exist_ok=True)
    socket_path = work / "report.sock"
    socket_path.touch()
    places = LearnerPlaces(
        writable=[work],
        readable=[],
        report_socket=socket_path,
        work_dir=work,
        network=job_network.JobNetwork(
            job_network.namespace_path(job_id), job_network.write_nsswitch(tmp_path / f"{job_id}.nsswitch")
        ),
    )
    sandbox = Sandbox.for_this_interpreter([])
    return [*sandbox.arguments(places, 0, 0), *command]


async def test_a_job_s_learners_meet_on_its_loopback_and_another_job_s_do_not_get_in(
    tmp_path: Path, jobs: list[str]
) -> None:
    job, other = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    jobs += [job, other]
    for job_id in jobs:
        assert await job_network.ensure(job_id) == job_network.namespace_path(job_id)
    host = socket.create_server(("127.0.0.1", 0))

    listener = await asyncio.create_subprocess_exec(
        *sandboxed(tmp_path, job, sys.executable, "-c", LISTEN), stdout=asyncio.subprocess.PIPE
    )
    assert listener.stdout is not None
    port = (await asyncio.wait_for(listener.stdout.readline(), 30)).decode().strip()

    async def connect(job_id: str, to: str) -> str:
        command = sandboxed(tmp_path, job_id, sys.executable, "-c", CONNECT, to)
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        return out.decode().strip()

    try:
        assert await connect(other, port) == "ConnectionRefusedError"  # another job's loopback is its own
        assert await connect(job, str(host.getsockname()[1])) == "ConnectionRefusedError"  # not the host's
        assert await connect(job, port) == "hello"  # its own gang's
        assert await asyncio.wait_for(listener.wait(), 30) == 0
    finally:
        host.close()
        if listener.returncode is None:
            listener.kill()
            await listener.wait()


async def test_a_job_s_namespace_is_made_afresh_by_each_launch_and_goes_with_the_job(jobs: list[str]) -> None:
    """Each launch makes it anew (a launch that failed may have left it), so its age is the launch's
    and a sweep does not take it for a leftover before the learners are in it."""
    job_id = "a job id / with what no file name takes \0 " + "x" * 300
    jobs.append(job_id)
    path = job_network.namespace_path(job_id)

    assert await job_network.ensure(job_id) == path
    first = path.stat().st_ino
    assert await job_network.ensure(job_id) == path
    assert path.stat().st_ino != first, "made anew"
    assert path.exists() and path.parent == job_network.NETNS_DIR and len(path.name) < 64

    await job_network.remove(job_id)
    assert not path.exists()
    await job_network.remove(job_id)  # removing it again is no error


async def test_a_namespace_a_process_is_still_in_is_kept_and_a_file_left_in_its_place_replaced(
    jobs: list[str],
) -> None:
    occupied, cut_short = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    jobs += [occupied, cut_short]
    path = await job_network.ensure(occupied)
    inside = await asyncio.create_subprocess_exec("nsenter", f"--net={path}", "--", "sleep", "60")
    try:
        await wait_until_async(lambda: command_of(inside.pid) == "sleep", 5, what="sleep in the namespace")
        kept = path.stat().st_ino
        assert await job_network.ensure(occupied) == path
        assert path.stat().st_ino == kept
    finally:
        inside.kill()
        await inside.wait()

    job_network.namespace_path(cut_short).touch()  # what an `ip netns add` killed midway leaves
    made = await job_network.ensure(cut_short)
    probe = await asyncio.create_subprocess_exec(
        "nsenter", f"--net={made}", "--", "ip", "-o", "link", "show", "lo", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await probe.communicate()
    assert probe.returncode == 0 and b"UP" in out


async def test_a_learner_in_a_job_network_is_told_at_once_that_a_name_is_unknown(
    tmp_path: Path, jobs: list[str]
) -> None:
    """No name server answers in a job's namespace: with the host's name service a reverse lookup of
    an address /etc/hosts lacks fails as *temporary*, and torch's c10d warns of each such failure."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    jobs.append(job_id)
    await job_network.ensure(job_id)
    lookup = "import socket; print(socket.getnameinfo(('::1', 80, 0, 0), socket.NI_NUMERICSERV)[0])"

    process = await asyncio.create_subprocess_exec(
        *sandboxed(tmp_path, job_id, sys.executable, "-c", lookup), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)

    assert (process.returncode, out.decode().strip()) == (0, "::1")


@pytest.mark.parametrize("network", ["job", "host"])
def test_where_no_job_network_can_be_made_the_sandbox_refuses_unless_learners_share_the_host_s(
    monkeypatch: pytest.MonkeyPatch, network: Literal["job", "host"]
) -> None:
    monkeypatch.setattr(job_network, "probe", lambda: "ip netns add: Operation not permitted")
    sandbox = Sandbox.for_this_interpreter([], network=network)

    if network == "host":
        sandbox.check(0, 0, {"PATH": "/usr/bin:/bin"})
        return
    with pytest.raises(SandboxUnavailable, match="Operation not permitted") as refused:
        sandbox.check(0, 0, {"PATH": "/usr/bin:/bin"})
    assert "FFDL_SANDBOX_NETWORK=host" in str(refused.value)


async def test_a_stop_sweeps_the_namespaces_nobody_is_in_long_after_their_making(
    monkeypatch: pytest.MonkeyPatch, jobs: list[str]
) -> None:
    """A platform that stops leaves its running learners, and their job's namespace, to a restarted
    one; once they are gone, nobody removes it but a sweep."""
    left, occupied = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    jobs += [left, occupied]
    for job_id in jobs:
        await job_network.ensure(job_id)
    names = [job_network.namespace_name(job_id) for job_id in jobs]
    made = job_network._made_before
    assert set(names) <= set(made(time.time() + 1)), "made before now"
    assert not set(names) & set(made(time.time() - 3600)), "not an hour ago"
    inside = await asyncio.create_subprocess_exec(
        "nsenter", f"--net={job_network.namespace_path(occupied)}", "--", "sleep", "60"
    )
    try:
        await wait_until_async(lambda: command_of(inside.pid) == "sleep", 5, what="sleep in the namespace")
        # only this test's namespaces: a sweep of all would take other tests' (made, not yet entered)
        monkeypatch.setattr(job_network, "_made_before", lambda cutoff: sorted(names))

        swept = await job_network.sweep()

        assert swept == [job_network.namespace_name(left)]
        assert not job_network.namespace_path(left).exists()
        assert job_network.namespace_path(occupied).exists(), "a learner is still in it"
    finally:
        inside.kill()
        await inside.wait()
