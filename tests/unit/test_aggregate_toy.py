"""A third aggregate kind, written against the public abstraction only: tenant GPU quotas.

It shows what adding a kind costs: its state, its events and commands, ``evolve``, ``decide`` and who
may send its commands (:class:`QuotaKind`), and nothing copied from jobs or nodes. Numbering, derived
event ids, the recent-command window, the fencing check, the fold step and the registry come from
:mod:`ffdl.core.aggregate`, the gate of who may send what from :mod:`ffdl.core.authorization`, and
the job owner decides quota commands beside jobs' through the same path (its registry of kinds, its
book and its gate). Only the wire is out of reach: the codec knows job and node envelopes, so the
quota's commands are handed to the owner decoded.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.aggregate import (
    Address,
    AggregateKind,
    Aggregates,
    Decision,
    EventHead,
    EvolveError,
    Kinds,
    Skip,
    Skipped,
    UnknownAggregate,
    fold_step,
    is_deposed,
    remember,
    seen,
)
from ffdl.core.authorization import Principal, PrincipalKind, Senders
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.events import job_commands as cmd
from ffdl.events.ids import derived_id
from ffdl.events.model import JobSpec
from ffdl.handlers import owner as owner_module
from ffdl.handlers.messaging import CommandSender, Topics, event_records
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import OutgoingRecord

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TENANT = "acme"

# -- the quota aggregate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SetQuota:
    limit: int


@dataclass(frozen=True)
class Reserve:
    job: str
    gpus: int


@dataclass(frozen=True)
class Release:
    job: str


QuotaCommandData = SetQuota | Reserve | Release


@dataclass(frozen=True)
class QuotaSet:
    limit: int


@dataclass(frozen=True)
class Reserved:
    job: str
    gpus: int


@dataclass(frozen=True)
class Released:
    job: str


@dataclass(frozen=True)
class QuotaRefused:
    command_type: str
    reason: str


QuotaEventData = QuotaSet | Reserved | Released | QuotaRefused


@dataclass(frozen=True)
class QuotaEvent:
    event_id: uuid.UUID
    seq: int
    occurred_at: datetime
    causation_id: uuid.UUID | None
    correlation_id: uuid.UUID | None
    producer: str
    fencing_token: int | None
    tenant: str
    data: QuotaEventData

    @property
    def key(self) -> str:
        return QUOTAS.key(self.tenant)

    @property
    def type(self) -> str:
        return type(self.data).__name__


@dataclass(frozen=True)
class QuotaCommand:
    command_id: uuid.UUID
    issued_at: datetime
    producer: str
    fencing_token: int | None
    tenant: str
    data: QuotaCommandData
    correlation_id: uuid.UUID | None = None

    @property
    def key(self) -> str:
        return QUOTAS.key(self.tenant)

    @property
    def type(self) -> str:
        return type(self.data).__name__


@dataclass(frozen=True)
class Quota:
    tenant: str
    seq: int
    limit: int
    held: tuple[tuple[str, int], ...] = ()
    recent_commands: tuple[int, ...] = ()

    @property
    def reserved(self) -> int:
        return sum(gpus for _, gpus in self.held)

    def holds(self, job: str) -> bool:
        return any(holder == job for holder, _ in self.held)

    def can_reserve(self, job: str, gpus: int) -> bool:
        return not self.holds(job) and self.reserved + gpus <= self.limit


class QuotaKind(AggregateKind[Quota, QuotaEvent, QuotaCommand, QuotaEventData]):
    name = "quota"
    id_field = "tenant"
    envelopes = (QuotaEvent, QuotaCommand)

    def identity(self, item: QuotaEvent | QuotaCommand) -> str:
        return item.tenant

    def key(self, identity: str) -> str:
        return f"quota:{identity}"

    def senders(self, command: QuotaCommand) -> Senders:
        """Admins set quotas; a tenant reserves and releases within its own."""
        if isinstance(command.data, SetQuota):
            return frozenset({PrincipalKind.ADMIN})
        return frozenset({PrincipalKind.TENANT, PrincipalKind.ADMIN})

    def owning_tenant(self, state: Quota | None, command: QuotaCommand) -> str:
        return state.tenant if state is not None else command.tenant

    def evolve(self, state: Quota | None, event: QuotaEvent) -> Quota:
        expected = state.seq + 1 if state is not None else 1
        if event.seq != expected:
            raise EvolveError(f"quota {event.tenant}: expected seq {expected}, got {event.seq}")
        data = event.data
        if state is None:
            if not isinstance(data, QuotaSet):
                raise EvolveError(f"quota {event.tenant} must begin with QuotaSet, not {event.type}")
            return Quota(event.tenant, event.seq, data.limit, (), remember((), event.causation_id))
        match data:
            case QuotaSet(limit=limit) if limit >= state.reserved:
                changed = replace(state, limit=limit)
            case Reserved(job=job, gpus=gpus) if state.can_reserve(job, gpus):
                changed = replace(state, held=(*state.held, (job, gpus)))
            case Released(job=job) if state.holds(job):
                changed = replace(state, held=tuple(h for h in state.held if h[0] != job))
            case QuotaRefused():
                changed = state
            case _:
                raise EvolveError(f"quota {event.tenant}: {event.type} cannot follow")
        recent = remember(state.recent_commands, event.causation_id)
        return replace(changed, seq=event.seq, recent_commands=recent)

    def decide(
        self,
        state: Quota | None,
        command: QuotaCommand,
        now: datetime,
        *,
        producer: str,
        leader_token: int | None,
    ) -> list[QuotaEvent]:
        decision = Decision(self, command, now, producer, state)
        data = command.data
        if state is None:
            if not isinstance(data, SetQuota):
                raise UnknownAggregate(f"no quota for {command.tenant}")
            decision.emit(QuotaSet(data.limit))
            return decision.events
        if seen(state, command.command_id):
            return []
        if is_deposed(command.fencing_token, None, leader_token):
            decision.reject("sender was deposed")
            return decision.events
        match data:
            case SetQuota(limit=limit) if limit < state.reserved:
                decision.reject(f"{state.reserved} GPUs are reserved already")
            case SetQuota(limit=limit):
                decision.emit(QuotaSet(limit))
            case Reserve(job=job) if state.holds(job):
                pass  # reserved already
            case Reserve(job=job, gpus=gpus) if state.reserved + gpus > state.limit:
                decision.reject(f"{gpus} more GPUs exceed the quota of {state.limit}")
            case Reserve(job=job, gpus=gpus):
                decision.emit(Reserved(job, gpus))
            case Release(job=job) if state.holds(job):
                decision.emit(Released(job))
            case Release():
                pass
        return decision.events

    def event(
        self, command: QuotaCommand, state: Quota | None, head: EventHead, data: QuotaEventData
    ) -> QuotaEvent:
        return QuotaEvent(**head, tenant=command.tenant, data=data)

    def rejection(self, command: QuotaCommand, reason: str) -> QuotaEventData:
        return QuotaRefused(command.type, reason)

    def address(self, tenant: str) -> Address[QuotaCommand, QuotaCommandData]:
        return Address(QuotaCommand, {"tenant": tenant})


QUOTAS = QuotaKind()
WITH_QUOTAS = Kinds(*KINDS, QUOTAS)


def command(data: QuotaCommandData, *, token: int | None = None) -> QuotaCommand:
    return QuotaCommand(uuid.uuid4(), NOW, "test", token, TENANT, data)


def decide_all(
    commands: list[QuotaCommand], leader_token: int | None = None
) -> tuple[Quota | None, list[QuotaEvent]]:
    state: Quota | None = None
    log: list[QuotaEvent] = []
    for sent in commands:
        events = QUOTAS.decide(state, sent, NOW, producer="owner", leader_token=leader_token)
        for event in events:
            state = QUOTAS.evolve(state, event)
        log += events
    return state, log


# -- tests ----------------------------------------------------------------------------------------


def test_a_decision_numbers_its_events_and_derives_their_ids_from_the_command() -> None:
    first, second = command(SetQuota(8)), command(Reserve("job-1", 4))
    quota, events = decide_all([first, second])
    assert [(e.seq, e.type) for e in events] == [(1, "QuotaSet"), (2, "Reserved")]
    assert events[1].event_id == derived_id(second.command_id, "owner", 0)
    assert events[1].causation_id == events[1].correlation_id == second.command_id
    assert quota is not None and quota.held == (("job-1", 4),)
    assert QUOTAS.decide(quota, second, NOW, producer="owner", leader_token=None) == []  # redelivered


def test_a_refusal_is_recorded_unfenced_and_a_deposed_sender_is_refused() -> None:
    _, events = decide_all([command(SetQuota(2)), command(Reserve("job-1", 4), token=3)], leader_token=3)
    assert isinstance(events[-1].data, QuotaRefused) and "exceed" in events[-1].data.reason
    assert events[-1].fencing_token is None
    _, deposed = decide_all([command(SetQuota(2)), command(Reserve("job-1", 1), token=2)], leader_token=3)
    assert deposed[-1].data == QuotaRefused("Reserve", "sender was deposed")


def test_the_fold_step_skips_what_every_reader_skips() -> None:
    _, events = decide_all([command(SetQuota(8)), command(Reserve("job-1", 4)), command(Release("job-1"))])
    quota = QUOTAS.evolve(None, events[0])
    assert fold_step(QUOTAS, quota, events[0]) == Skipped(Skip.TAKEN, "seq 1 is taken")
    assert fold_step(QUOTAS, quota, events[2]) == Skipped(Skip.GAP, "expected seq 2, got 3")
    illegal = replace(events[2], seq=2)  # releases a job that holds nothing
    assert fold_step(QUOTAS, quota, illegal) == Skipped(Skip.ILLEGAL, "quota acme: Released cannot follow")
    assert fold_step(QUOTAS, quota, events[1]) == QUOTAS.evolve(quota, events[1])


def test_the_registry_dispatches_a_third_kind_beside_jobs_and_nodes() -> None:
    _, events = decide_all([command(SetQuota(8))])
    assert WITH_QUOTAS.of(events[0]) is QUOTAS and WITH_QUOTAS.of(command(SetQuota(1))) is QUOTAS
    assert KINDS.find(events[0]) is None
    with pytest.raises(UnknownAggregate):
        KINDS.of(events[0])
    book = Aggregates(WITH_QUOTAS)
    applied = book.fold(events[0])
    assert not isinstance(applied, Skipped) and applied is not None
    assert applied.of(QUOTAS) is applied and applied.of(JOBS) is None
    assert book.of(QUOTAS)[TENANT].limit == 8 and book.of(NODES) == {}


def records_with_toy_events(
    events: Sequence[Any], source: str, *, command_offset: int | None = None
) -> list[OutgoingRecord]:
    """The owner's encoding of what it decided, for a registry with the toy kind, whose events have no
    form in the wire codec: they are written as their ``repr``."""
    return [
        OutgoingRecord(e.tenant, repr(e).encode())
        if isinstance(e, QuotaEvent)
        else event_records([e], source, command_offset=command_offset)[0]
        for e in events
    ]


async def test_the_job_owner_decides_a_third_kind_through_the_same_path_as_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_module, "event_records", records_with_toy_events)
    bus = open_bus(f"embedded://{tmp_path / 'log'}", 1)
    topics = Topics()
    owner = JobOwner(bus, topics, FileElection(tmp_path / "election"), kinds=WITH_QUOTAS, clock=lambda: NOW)
    admin, tenant = Principal.admin("ops"), Principal.tenant(TENANT)
    sender = CommandSender(bus, topics, "api", tenant)
    spec = JobSpec(name="train", command="python train.py", gpus=4)
    submit = sender.make(JOBS.address("job-1", TENANT), cmd.SubmitJob(spec=spec))
    submitted = owner.decide(submit, 0, tenant, None)
    set_quota = sender.make(QUOTAS.address(TENANT), SetQuota(8))
    assert isinstance(set_quota, QuotaCommand)
    decided = owner.decide(set_quota, 0, admin, None)
    decided += owner.decide(sender.make(QUOTAS.address(TENANT), Reserve("job-1", 4)), 0, tenant, None)
    raised = sender.make(QUOTAS.address(TENANT), SetQuota(64))
    refused = owner.decide(raised, 0, tenant, None)  # a tenant may not raise its own quota
    assert [e.type for e in submitted] == ["JobSubmitted"]
    assert [(e.seq, e.type) for e in decided] == [(1, "QuotaSet"), (2, "Reserved")]
    assert [e.data for e in refused] == [
        QuotaRefused("SetQuota", "tenant:acme may not send SetQuota: only admins may")
    ]
    assert owner.book.jobs["job-1"].seq == 1
    assert owner.book.of(QUOTAS)[TENANT].held == (("job-1", 4),)
    assert owner.decide(set_quota, 0, admin, None) == []  # a redelivery decides nothing
    with pytest.raises(UnknownAggregate):  # no quota yet: a dead letter for the owner
        owner.decide(replace(set_quota, tenant="globex", data=Reserve("job-2", 1)), 0, admin, None)
    plain = JobOwner(bus, topics, FileElection(tmp_path / "election"))
    with pytest.raises(UnknownAggregate):  # an owner without the kind cannot decide it
        plain.decide(set_quota, 0, admin, None)


COMMANDS = st.lists(
    st.one_of(
        st.builds(SetQuota, st.integers(0, 8)),
        st.builds(Reserve, st.sampled_from(["a", "b", "c"]), st.integers(1, 4)),
        st.builds(Release, st.sampled_from(["a", "b", "c"])),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(payloads=COMMANDS, redelivered=st.lists(st.integers(0, 29), max_size=10))
def test_deciding_folds_to_what_reading_folds_and_never_exceeds_the_quota(
    payloads: list[QuotaCommandData], redelivered: list[int]
) -> None:
    sent = [command(SetQuota(4)), *(command(data) for data in payloads)]
    quota, events = decide_all(sent)
    assert quota is not None and quota.reserved <= quota.limit
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # A command that caused events is remembered, so its redelivery decides nothing. (One that
    # decided nothing is not: sent again later, it is decided on the state then, like a new one.)
    caused = {e.causation_id for e in events}
    again = [sent[i] for i in redelivered if i < len(sent) and sent[i].command_id in caused]
    assert decide_all([*sent, *again]) == (quota, events)
    book = Aggregates(WITH_QUOTAS)
    for event in [*events, *events]:  # the second pass: every event a duplicate, skipped
        book.fold(event)
    assert book.of(QUOTAS)[TENANT] == quota
