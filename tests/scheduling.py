"""A job owner and a leading scheduler running on one embedded log, for the scheduler role's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.authorization import SCHEDULER, Principal, PrincipalKind
from ffdl.core.kinds import KINDS
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.events.codec import AnyCommand
from ffdl.events.envelope import Command
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, InventorySource
from ffdl.handlers.runtime import consume
from ffdl.handlers.scheduler import Scheduler


def honest_principal(command: AnyCommand) -> Principal:
    """Whom an honest sender sends ``command`` for: the job's tenant for what a user asks, an operator
    for a node command, else one of the platform's roles (for what they observe)."""
    senders = KINDS.of(command).senders(command)
    if isinstance(command, Command) and PrincipalKind.TENANT in senders:
        return Principal.tenant(command.tenant)
    if PrincipalKind.ADMIN in senders:
        return Principal.admin("ops")
    return Principal.platform("test")


@dataclass(frozen=True, slots=True)
class Running:
    bus: Bus
    topics: Topics
    owner: JobOwner
    scheduler: Scheduler
    token: int


@asynccontextmanager
async def owner_and_scheduler(
    tmp_path: Path, partitions: int, inventory: InventorySource
) -> AsyncIterator[Running]:
    """The owner consuming commands, the elected scheduler folding events and planning, until exit.
    Preemption has no minimum runtime, so tests need not wait for one."""
    bus = open_bus(f"embedded://{tmp_path / 'log'}", partitions)
    await bus.start()
    topics = Topics()
    election = FileElection(tmp_path / "election")
    token = await election.campaign(SCHEDULER_ROLE)
    owner = JobOwner(bus, topics, election)
    sender = CommandSender(bus, topics, "scheduler", SCHEDULER)
    policy = SchedulerPolicy(min_runtime_s=0.0)
    scheduler = Scheduler(bus, topics.events, sender, inventory, token, policy=policy)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop)),
        asyncio.create_task(consume(bus, "scheduler", [topics.events], scheduler, stop)),
        asyncio.create_task(scheduler.plan_forever(stop)),
    ]
    try:
        yield Running(bus, topics, owner, scheduler, token)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await bus.close()
        await election.close()
