"""Leader election through etcd: one leader at a time, growing fencing tokens, takeover within the TTL.

Also the fencing invariant that ``ffdl verify`` checks, and the file election's cancellable campaign.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest

from ffdl.adapters.election import FileElection, open_election
from ffdl.adapters.election_etcd import EtcdElection
from ffdl.core.invariants import InvariantChecker, ViolationKind
from ffdl.events import job_events as ev
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, Placement, WaitReason
from tests.services import EtcdServer, wait_until_async

pytestmark = pytest.mark.integration

TTL_S = 1.0
# Scheduling slack on a busy two-core machine.
SLACK_S = 3.0


@pytest.fixture
def role() -> str:
    return f"role-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def elections(etcd_server: EtcdServer) -> AsyncIterator[list[EtcdElection]]:
    """Two election clients, as two processes would hold them."""
    made = [
        EtcdElection(etcd_server.host, etcd_server.port, TTL_S, identity=f"candidate-{i}") for i in range(2)
    ]
    yield made
    for election in made:
        await election.close()


async def test_one_leader_at_a_time_and_the_next_gets_a_larger_token(
    elections: list[EtcdElection], role: str
) -> None:
    first, second = elections
    assert await first.current_token(role) is None
    token = await first.campaign(role)
    assert await first.campaign(role) == token, "campaigning again while leading keeps the term"
    assert await first.current_token(role) == token
    assert await first.is_leader(role, token)

    waiting = asyncio.create_task(second.campaign(role))
    await asyncio.sleep(3 * TTL_S)  # several lease renewals: the leader keeps the role
    assert not waiting.done()
    assert await first.is_leader(role, token)

    resigned_at = time.monotonic()
    await first.resign(role)
    async with asyncio.timeout(SLACK_S):
        successor = await waiting
    assert time.monotonic() - resigned_at < SLACK_S
    assert successor > token
    assert await second.current_token(role) == successor
    assert await second.is_leader(role, successor)
    assert not await first.is_leader(role, token)


def hold_leadership(etcd_server: EtcdServer, role: str) -> subprocess.Popen[str]:
    """A process that wins ``role`` and prints its token, then holds it until killed."""
    program = (
        "import asyncio, sys\n"
        "from ffdl.adapters.election_etcd import EtcdElection\n"
        "async def main():\n"
        f"    election = EtcdElection({etcd_server.host!r}, {etcd_server.port}, {TTL_S}, identity='doomed')\n"
        f"    print('token', await election.campaign({role!r}), flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    return subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)


def printed_token(output: IO[str]) -> int:
    """The token the leader process prints on the line ``token N`` (its log lines come first)."""
    for line in output:
        if line.startswith("token "):
            return int(line.split()[1])
    raise AssertionError("the leader process ended without printing its token")


async def test_a_leader_killed_with_sigkill_is_replaced_within_the_ttl(
    etcd_server: EtcdServer, elections: list[EtcdElection], role: str
) -> None:
    leader = hold_leadership(etcd_server, role)
    try:
        assert leader.stdout is not None
        token = await asyncio.wait_for(asyncio.to_thread(printed_token, leader.stdout), 30)
        candidate = asyncio.create_task(elections[0].campaign(role))
        await asyncio.sleep(0.2)
        assert not candidate.done()
        leader.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        async with asyncio.timeout(TTL_S + SLACK_S):
            successor = await candidate
        assert time.monotonic() - killed_at <= TTL_S + SLACK_S
        assert successor > token
    finally:
        leader.kill()
        leader.wait()


async def test_a_leader_cut_off_from_etcd_stops_leading_before_its_lease_can_expire(
    etcd_server: EtcdServer, role: str
) -> None:
    # A longer TTL than the other tests': the margin (a quarter of it) must outlast a loaded
    # machine's stall of the event loop, as a second of TTL left a quarter second.
    ttl_s = 3.0
    first, second = (
        EtcdElection(etcd_server.host, etcd_server.port, ttl_s, identity=f"cut-off-{i}") for i in range(2)
    )
    try:
        token = await first.campaign(role)
        etcd_server.pause()
        try:
            paused_at = time.monotonic()
            await wait_until_async(lambda: not_leading(first, role, token), 2 * ttl_s, what="leadership lost")
            # The term ends a quarter TTL before etcd could expire the lease (renewals are every TTL/3).
            assert time.monotonic() - paused_at < ttl_s
        finally:
            etcd_server.resume()
        successor = await asyncio.wait_for(second.campaign(role), 2 * ttl_s + SLACK_S)
        assert successor > token
        assert not await first.is_leader(role, token), "a lost term stays lost"
        assert await first.current_token(role) == successor
    finally:
        await first.close()
        await second.close()


async def not_leading(election: EtcdElection, role: str, token: int) -> bool:
    return not await election.is_leader(role, token)


async def test_current_token_fails_loudly_while_etcd_is_frozen(
    etcd_server: EtcdServer, elections: list[EtcdElection], role: str
) -> None:
    etcd_server.pause()
    try:
        with pytest.raises(ConnectionError):
            await elections[0].current_token(role)
    finally:
        etcd_server.resume()
    assert await elections[0].current_token(role) is None


def test_open_election_picks_the_adapter_the_url_names(tmp_path: Path) -> None:
    assert isinstance(open_election(f"file://{tmp_path}", 5), FileElection)
    assert isinstance(open_election("etcd://127.0.0.1:2379", 5), EtcdElection)
    for bad in ("file://relative", "etcd://127.0.0.1", "zk://host:1", "etcd://h:1?x=1"):
        with pytest.raises(ValueError, match="file:///ABSOLUTE/DIR or etcd://HOST:PORT"):
            open_election(bad, 5)


async def test_a_file_election_candidate_can_be_cancelled(tmp_path: Path) -> None:
    leader, candidate = FileElection(tmp_path), FileElection(tmp_path)
    assert await leader.campaign("scheduler") == 1
    waiting = asyncio.create_task(candidate.campaign("scheduler"))
    await asyncio.sleep(0.3)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 1)
    await leader.close()
    assert await asyncio.wait_for(candidate.campaign("scheduler"), 2) == 2
    await candidate.close()


# -- the fencing invariant ---------------------------------------------------------------------

SPEC = JobSpec(name="mnist", command="python train.py", learners=1, gpus=1)
AT = datetime(2025, 1, 1, tzinfo=UTC)


def event(job_id: str, seq: int, data: EventData, token: int | None = None) -> Event:
    return Event(
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{job_id}/{seq}"),
        job_id=job_id,
        tenant="acme",
        seq=seq,
        occurred_at=AT,
        producer="test",
        fencing_token=token,
        data=data,
    )


def queued(job_id: str) -> list[Event]:
    return [
        event(job_id, 1, ev.JobSubmitted(spec=SPEC)),
        event(job_id, 2, ev.JobAccepted()),
        event(job_id, 3, ev.JobQueued()),
    ]


def gpu(index: int) -> Placement:
    return Placement(learners=(LearnerPlacement(rank=0, node="node-1", gpus=(index,)),))


def violations_of(log: list[tuple[int, Event]]) -> list[tuple[ViolationKind, str, str]]:
    checker = InvariantChecker()
    for offset, (partition, logged) in enumerate(log):
        checker.feed(logged, f"{partition}:{offset}", partition=partition)
    return [(v.kind, v.job_id, v.detail) for v in checker.finish()]


def test_a_deposed_leaders_event_after_its_successors_in_the_same_partition_is_reported() -> None:
    log = [(0, e) for e in [*queued("job-a"), *queued("job-b")]]
    log += [
        (0, event("job-a", 4, ev.GpusAllocated(placement=gpu(0)), token=7)),
        (0, event("job-b", 4, ev.JobWaiting(code=WaitReason.CAPACITY, detail="waits"), token=5)),
    ]

    assert violations_of(log) == [
        (
            ViolationKind.STALE_FENCING_TOKEN,
            "job-b",
            "fencing token 5 after token 7 was applied in partition 0",
        )
    ]


def test_tokens_of_other_partitions_and_rejections_are_not_stale() -> None:
    log = [(0, e) for e in queued("job-a")] + [(1, e) for e in queued("job-b")]
    log += [
        (0, event("job-a", 4, ev.GpusAllocated(placement=gpu(0)), token=7)),
        (
            0,
            event("job-a", 5, ev.CommandRejected(command_id="c", command_type="AllocateGpus", reason="x"), 5),
        ),
        (1, event("job-b", 4, ev.GpusAllocated(placement=gpu(1)), token=5)),
    ]

    assert violations_of(log) == []
