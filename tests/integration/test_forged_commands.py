"""Hostile clients against the whole platform, on the embedded log and on Kafka (tansu).

A tenant with direct access to the broker, an outside producer that writes to the commands topic
without saying who it is, a platform role's credentials used for the scheduler's work, a scheduler
that places on busy or missing GPUs: every forged command is refused by the job's or node's owner
(recorded as the aggregate's rejection with the reason; dead-lettered when it would create one, or
when a tenant sends it to another tenant's job or to a node, whose histories others read)
and logged with its principal; nothing is double-booked; ``ffdl verify`` finds the log clean and
``verify --redecide`` decides every exported command again, for its recorded principal, as the owner
did.

tansu authenticates no principal, and the embedded log has no ACLs: where the platform meets a
broker's authentication is the topic a record is written to (docs/security.md: only the platform's
credentials may write the commands topic, only tenant ``acme``'s may write ``PREFIX.tenant.acme.commands``).
So the tests write each forged record to the topic its sender could write under those ACLs, and
what they pin is the platform's half of the design: the ingress relay's mapping from topic to
principal (whatever the record's headers and body say) and the owner's decisions.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from ffdl.adapters.tenants import TenantRegistry
from ffdl.cli.serve import api_server
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, any_event_from_json, command_headers, command_to_json
from ffdl.events.envelope import Command, CommandData, NodeCommand
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.messaging import PRINCIPAL_HEADER
from ffdl.handlers.owner import SCHEDULER_ROLE
from ffdl.handlers.ports import OutgoingRecord
from ffdl.tools.log_files import EventFilter
from ffdl.tools.redecide import export_commands_beside, redecide_files
from ffdl.tools.sre import events_topic, export_log, verify_log
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import bus_under_test, fast_settings, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.integration

#: A job that holds all of node-a's GPUs until it is cancelled, and one that waits for them.
HOLDER = manifest("holder", learners=1, gpus=4, args=["--steps", "100000", "--delay", "0.05"])
WAITER = manifest("waiter", learners=1, gpus=2, args=["--steps", "5"])


@pytest.fixture(params=["embedded", "kafka"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        nodes=[{"name": "node-a", "gpus": 4, "gpu_type": "a100"}],
        direct_tenants=["acme", "globex"],
        **bus_under_test(request),
    )


class Tenants:
    """An API client per tenant (``ops`` is an admin), with the platform they call."""

    def __init__(self, platform: Platform, clients: dict[str, httpx.AsyncClient]) -> None:
        self.platform = platform
        self.clients = clients

    def __getitem__(self, tenant: str) -> httpx.AsyncClient:
        return self.clients[tenant]

    async def submit(self, tenant: str, text: str) -> str:
        response = await self[tenant].post(
            "/v1/jobs", content=text, headers={"Content-Type": "application/yaml"}
        )
        assert response.status_code == 201, response.text
        return str(response.json()["job_id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self["ops"].get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def wait(self, job_id: str, *states: str, released: bool = False) -> dict[str, Any]:
        found: dict[str, Any] = {}

        async def there() -> bool:
            found.update(await self.job(job_id))
            return found["state"] in states and (not released or found["placement"] is None)

        await wait_until_async(there, 60, interval_s=0.1, what=f"{job_id} {states}")
        return found


@pytest.fixture
async def tenants(settings: Settings) -> AsyncIterator[Tenants]:
    registry = TenantRegistry(settings.tenants_path)
    tokens = {name: registry.add(name) for name in ("acme", "globex")} | {
        "ops": registry.add("ops", admin=True)
    }
    async with Platform(settings) as platform:
        server = api_server(platform, settings.api)
        serving = asyncio.create_task(server.serve())
        clients = {
            name: httpx.AsyncClient(
                base_url=settings.api, timeout=30, headers={"Authorization": f"Bearer {token}"}
            )
            for name, token in tokens.items()
        }
        await wait_until_async(lambda: server.started, 10, what="the API serving")
        try:
            yield Tenants(platform, clients)
        finally:
            for client in clients.values():
                await client.aclose()
            server.should_exit = True
            await serving


class Forger:
    """Writes commands straight to a topic of the bus, with whatever headers a forger chooses."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    def job(self, job_id: str, tenant: str, data: CommandData, *, token: int | None = None) -> Command:
        return Command(
            command_id=uuid.uuid4(),
            job_id=job_id,
            tenant=tenant,
            issued_at="2026-01-01T00:00:00Z",
            producer="api@forged",
            fencing_token=token,
            data=data,
        )

    def node(self, name: str, data: nd.NodeCommandData) -> NodeCommand:
        return NodeCommand(
            command_id=uuid.uuid4(),
            node=name,
            issued_at="2026-01-01T00:00:00Z",
            producer="intruder",
            data=data,
        )

    async def write(self, topic: str, command: AnyCommand, principal: str | None = None) -> AnyCommand:
        headers = list(command_headers(command, command.producer))
        if principal is not None:
            headers.append((PRINCIPAL_HEADER, principal.encode()))
        await self.platform.bus.publish(
            topic, [OutgoingRecord(command.key, command_to_json(command), tuple(headers))]
        )
        return command

    async def answer(self, command: AnyCommand) -> str:
        """The reason the owner refused ``command`` with: its rejection event's, or its dead letter's."""
        bus, topics = self.platform.bus, self.platform.topics
        cause = str(command.command_id)
        found: list[str] = []

        async def answered() -> bool:
            partition = bus.partition_for(command.key)
            async for record in bus.read(topics.events, partition):
                event = any_event_from_json(record.value)
                if str(event.causation_id) == cause:
                    found.append(getattr(event.data, "reason", event.type))
                    return True
            async for record in bus.read(topics.deadletter, partition):
                if (dict(record.headers).get("ce_id") or b"").decode() == cause:
                    found.append("dead letter: " + dict(record.headers)["ffdl_dlq_reason"].decode())
                    return True
            return False

        await wait_until_async(answered, 30, interval_s=0.1, what=f"the owner's answer to {command.type}")
        return found[0]


def on(node: str, *gpus: int) -> Placement:
    return Placement(learners=(LearnerPlacement(rank=0, node=node, gpus=gpus, gpu_type="a100"),))


@dataclass(frozen=True)
class Attempt:
    """One forged command: what it is, where it is written, with which principal header (None: none),
    whom the platform attributes it to, and the refusal expected."""

    what: str
    topic: str
    command: AnyCommand
    header: str | None
    principal: str
    refusal: str


async def test_forged_commands_of_every_kind_are_refused_logged_and_nothing_is_double_booked(
    tenants: Tenants, settings: Settings, tmp_path: Path
) -> None:
    platform = tenants.platform
    topics = platform.topics
    forger = Forger(platform)
    holder = await tenants.submit("acme", HOLDER)
    await tenants.wait(holder, "RUNNING")
    waiter = await tenants.submit("globex", WAITER)
    await tenants.wait(waiter, "QUEUED")
    token = await platform.election.current_token(SCHEDULER_ROLE)
    assert token is not None
    acme_topic, globex_topic = topics.ingress("acme"), topics.ingress("globex")

    def allocation(*gpus: int, node: str = "node-a", token: int | None = token) -> Command:
        return forger.job(waiter, "globex", cmd.AllocateGpus(placement=on(node, *gpus)), token=token)

    only_the_scheduler = "may not send AllocateGpus: only the scheduler may"
    attempts = [
        Attempt(
            "another tenant's cancel, naming the job's tenant and claiming to be an admin",
            globex_topic,
            forger.job(holder, "acme", cmd.CancelJob(reason="mine now")),
            "admin:ops",
            "tenant:globex",
            "dead letter: CancelJob from tenant:globex refused: job belongs to another tenant than 'globex'",
        ),
        Attempt(
            "a cancel from an unauthenticated producer on the commands topic",
            topics.commands,
            forger.job(holder, "acme", cmd.CancelJob(reason="anyone")).model_copy(
                update={"producer": "intruder"}
            ),
            None,
            "anonymous",
            "anonymous may not send CancelJob: only its tenant or admins may",
        ),
        Attempt(
            "an allocation without a token, from a tenant",
            globex_topic,
            allocation(0, 1, token=None),
            None,
            "tenant:globex",
            f"tenant:globex {only_the_scheduler}",
        ),
        Attempt(
            "an allocation with the current token, from a tenant claiming to be the scheduler",
            globex_topic,
            allocation(0, 1),
            "scheduler",
            "tenant:globex",
            f"tenant:globex {only_the_scheduler}",
        ),
        Attempt(
            "an allocation with the current token from a platform role that is not the scheduler",
            topics.commands,
            allocation(2, 3),
            "platform:reactor",
            "platform:reactor",
            f"platform:reactor {only_the_scheduler}",
        ),
        Attempt(
            "the scheduler's allocation without its token",
            topics.commands,
            allocation(2, 3, token=None),
            "scheduler",
            "scheduler",
            "the scheduler's commands count only with its fencing token: this one has none",
        ),
        Attempt(
            "a placement on GPUs another job holds",
            topics.commands,
            allocation(2, 3),
            "scheduler",
            "scheduler",
            "GPU 2 of node node-a is held by another job",
        ),
        Attempt(
            "a placement on a node the inventory does not have",
            topics.commands,
            allocation(0, 1, node="node-z"),
            "scheduler",
            "scheduler",
            "node node-z is not in the inventory",
        ),
        Attempt(
            "a placement on GPUs the node does not have",
            topics.commands,
            allocation(6, 7),
            "scheduler",
            "scheduler",
            "node node-a has no GPU 6 (it has 4)",
        ),
        Attempt(
            "a preemption from a tenant",
            globex_topic,
            forger.job(holder, "acme", cmd.HaltJob(reason="make room", requeue=True)),
            None,
            "tenant:globex",
            "dead letter: HaltJob from tenant:globex refused: "
            "tenant:globex may not send HaltJob: only the scheduler may",
        ),
        Attempt(
            "a learner's exit reported by a tenant",
            acme_topic,
            forger.job(holder, "acme", cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)),
            None,
            "tenant:acme",
            "tenant:acme may not send ReportLearnerExited: only the platform's roles may",
        ),
        Attempt(
            "a drain from a tenant claiming to be an admin",
            acme_topic,
            forger.node("node-a", nd.CordonNode(reason="mine", drain=True)),
            "admin:ops",
            "tenant:acme",
            "dead letter: CordonNode from tenant:acme refused: "
            "tenant:acme may not send CordonNode: only admins may",
        ),
        Attempt(
            "a node removal from an unauthenticated producer",
            topics.commands,
            forger.node("node-a", nd.RemoveNode(reason="gone")),
            None,
            "anonymous",
            "anonymous may not send RemoveNode: only admins or the scheduler may",
        ),
        Attempt(
            "a submission in another tenant's name",
            acme_topic,
            forger.job("stolen-1", "globex", cmd.SubmitJob(spec=JobSpec(name="stolen", command="true"))),
            None,
            "tenant:acme",
            "dead letter: SubmitJob from tenant:acme refused: job belongs to another tenant than 'acme'",
        ),
    ]
    with structlog.testing.capture_logs() as logs:
        for attempt in attempts:
            await forger.write(attempt.topic, attempt.command, attempt.header)
        answers = {attempt.what: await forger.answer(attempt.command) for attempt in attempts}

    assert answers == {attempt.what: attempt.refusal for attempt in attempts}
    refused = {
        entry["command_id"]: entry["principal"] for entry in logs if entry["event"] == "command refused"
    }
    assert {attempt.what: refused.get(str(attempt.command.command_id)) for attempt in attempts} == {
        attempt.what: attempt.principal for attempt in attempts
    }
    # Through the API a tenant may not drain either; the job holding the GPUs is untouched by all the above.
    drain = await tenants["acme"].post("/v1/nodes/node-a:cordon", json={"reason": "mine", "drain": True})
    assert drain.status_code == 403
    running = await tenants.job(holder)
    assert running["state"] == "RUNNING" and [learner["gpus"] for learner in running["learners"]] == [
        [0, 1, 2, 3]
    ]
    assert (await tenants.job(waiter))["state"] == "QUEUED"

    # The holder's tenant cancels it; the scheduler gives the waiter the freed GPUs.
    cancelled = await tenants["acme"].delete(f"/v1/jobs/{holder}")
    assert cancelled.status_code == 202, cancelled.text
    await tenants.wait(holder, "CANCELLED", released=True)
    await tenants.wait(waiter, "COMPLETED", released=True)

    assert (await verify_log(settings))["violations"] == []
    events = tmp_path / "hostile.events.jsonl"
    exported = await export_commands_beside(str(events), settings.bus_url, settings, EventFilter())
    out = io.StringIO()
    await export_log(settings.bus_url, settings.partitions, events_topic(settings), EventFilter(), out)
    events.write_text(out.getvalue())
    redecided = redecide_files(events, settings.restart_policy)
    assert exported["dead_lettered"] == []
    assert (redecided["divergences"], redecided["known_changes"]) == (0, {}), redecided["first_divergence"]
