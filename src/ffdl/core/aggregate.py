"""What every aggregate is, so that jobs, nodes and any later kind are decided, folded and dispatched alike.

An aggregate kind (:class:`AggregateKind`) is a decider: ``decide(state, command, now) -> events``
and ``evolve(state, event) -> state``, both pure. What surrounds those two is the same for every
kind, so it is written here once:

* numbering and ids: one owner appends an aggregate's events, numbered 1, 2, 3 ... (``seq``); a
  :class:`Decision` numbers what it emits from the aggregate's ``seq`` and derives each event's id
  from the command's, so deciding the same command twice yields the same events and a reader can
  tell a duplicate from a conflict;
* the recent-command window: an aggregate remembers the last :data:`COMMAND_WINDOW` ids of the
  commands that caused its events (:func:`remember`), so a command sent again, the same id at
  another place on the log (a retried send, a reaction re-driven, a copy a relay the group had
  expelled still appended), decides nothing again (:func:`seen`); one that decided nothing is not
  remembered, and is decided afresh. The window is bounded, so it is not what keeps the consumer's
  redeliveries from being decided twice: a command delivered again after more than
  :data:`COMMAND_WINDOW` others of its aggregate that caused events, or one that decided nothing,
  would be decided again, in the state the commands after it left. The owner recognises those
  exactly, by the command's offset on the commands topic, which the records of its events name
  (:mod:`ffdl.handlers.owner`), and the ingress relay copies a tenant's record once
  (:mod:`ffdl.handlers.ingress`); the window is left what neither can tell (a command sent again at
  another offset, a log whose events name no offset);
* fencing: a command carrying a token that is not the current leader's comes from a deposed
  leader (:func:`is_deposed`);
* who may send what: each kind says which principals may send each of its commands
  (:meth:`AggregateKind.senders`), and the owner decides through the gate of
  :mod:`ffdl.core.authorization`;
* the one fold step every reader takes per event (:func:`fold_step`): an event whose seq is taken
  (a redelivered duplicate, or a conflict a stale owner wrote), one after a gap, or one its
  aggregate's state does not allow is skipped, never applied, and the reader counts it;
* dispatch: :class:`Kinds` maps an envelope to its kind, so code that handles several kinds asks
  the registry instead of testing envelope classes, and :class:`Aggregates` keeps one keyed book
  per kind.

Adding a kind means writing its state, its envelopes and payloads, and its :class:`AggregateKind`
(``evolve``, ``decide``, who may send its commands and how its envelopes name an aggregate); nothing
of the above is copied (``tests/unit/test_aggregate_toy.py`` adds one, tenant quotas, this way).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, cast

from ffdl.events.ids import derived_id
from ffdl.events.job_events import within_reason

if TYPE_CHECKING:
    from ffdl.core.authorization import Senders

#: How many recent command ids an aggregate remembers to drop commands sent again (the owner drops the
#: consumer's redeliveries by their offset, however far back: :mod:`ffdl.handlers.owner`).
COMMAND_WINDOW = 64


class EvolveError(ValueError):
    """An event that cannot apply to the aggregate: wrong seq, wrong aggregate, or illegal in its state."""


class UnknownAggregate(LookupError):
    """A command for an aggregate that does not exist and that the command cannot create: a dead letter."""


class AggregateState(Protocol):
    """What every kind's state has: the seq of its last event and the ids of its recent commands."""

    @property
    def seq(self) -> int: ...

    @property
    def recent_commands(self) -> tuple[int, ...]: ...


class EventEnvelope(Protocol):
    """What every kind's event envelope has (the codec gives them their wire form)."""

    @property
    def event_id(self) -> uuid.UUID: ...

    @property
    def seq(self) -> int: ...

    @property
    def key(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def causation_id(self) -> uuid.UUID | None: ...


class CommandEnvelope(Protocol):
    """What every kind's command envelope has."""

    @property
    def command_id(self) -> uuid.UUID: ...

    @property
    def correlation_id(self) -> uuid.UUID | None: ...

    @property
    def fencing_token(self) -> int | None: ...

    @property
    def key(self) -> str: ...

    @property
    def type(self) -> str: ...


S = TypeVar("S", bound=AggregateState)
E = TypeVar("E", bound=EventEnvelope)
C = TypeVar("C", bound=CommandEnvelope)
D = TypeVar("D")  # a kind's event payload
P = TypeVar("P")  # a kind's command payload
S2 = TypeVar("S2", bound=AggregateState)
E2 = TypeVar("E2", bound=EventEnvelope)


class EventHead(TypedDict):
    """The envelope fields of a decided event that do not name its aggregate."""

    event_id: uuid.UUID
    seq: int
    occurred_at: datetime
    causation_id: uuid.UUID
    correlation_id: uuid.UUID
    producer: str
    fencing_token: int | None


class CommandHead(TypedDict):
    """The envelope fields of a command that do not name its aggregate."""

    command_id: uuid.UUID
    issued_at: datetime
    producer: str
    fencing_token: int | None


def seen(state: AggregateState, command_id: uuid.UUID) -> bool:
    """Whether ``command_id`` caused one of the aggregate's recent events (a repeat decides nothing)."""
    return command_id.int in state.recent_commands


def remember(recent: tuple[int, ...], command_id: uuid.UUID | None) -> tuple[int, ...]:
    """The recent-command window after an event caused by ``command_id`` (None: caused by no command).

    The window holds the ids' ints: looking one up compares ints in C, where comparing UUIDs calls
    ``UUID.__eq__`` (Python) once per remembered id, on every event every reader folds.
    """
    if command_id is None:
        return recent
    command = command_id.int
    if command in recent:
        return recent
    return (*recent[-(COMMAND_WINDOW - 1) :], command)


def is_deposed(token: int | None, aggregate_token: int | None, leader_token: int | None) -> bool:
    """Whether a command fenced with ``token`` comes from a deposed leader: a token below one the
    aggregate has applied already, or other than the current leader's (unfenced commands never are;
    that the scheduler's commands carry the leader's token at all is the owner's gate's to check,
    :func:`ffdl.core.authorization.fencing_problem`)."""
    if token is None:
        return False
    return (aggregate_token is not None and token < aggregate_token) or (
        leader_token is not None and token != leader_token
    )


class AggregateKind(ABC, Generic[S, E, C, D]):
    """One kind of aggregate: its pure decider and fold, and how its envelopes name an aggregate.

    ``S`` is its state, ``E`` and ``C`` its event and command envelopes, ``D`` its event payloads.
    """

    #: What logs, reports and the registry call the kind ("job").
    name: ClassVar[str]
    #: The name of an aggregate's id in logs and reports ("job_id").
    id_field: ClassVar[str]
    #: Its event and command envelope classes: how the registry recognises its envelopes.
    envelopes: ClassVar[tuple[type, ...]]

    @abstractmethod
    def identity(self, item: E | C) -> str:
        """The id of the aggregate an event or command is about, within its kind."""

    @abstractmethod
    def key(self, identity: str) -> str:
        """The log key of the aggregate ``identity``: all its records on one partition, one owner."""

    @abstractmethod
    def evolve(self, state: S | None, event: E) -> S:
        """The state after ``event`` (``state`` None: the event creates the aggregate); raises
        :class:`EvolveError` for an event that cannot follow."""

    @abstractmethod
    def decide(
        self, state: S | None, command: C, now: datetime, *, producer: str, leader_token: int | None
    ) -> list[E]:
        """The events ``command`` causes (``state`` None: the aggregate does not exist yet)."""

    @abstractmethod
    def event(self, command: C, state: S | None, head: EventHead, data: D) -> E:
        """The envelope of an event decided on ``command``: ``head`` plus the fields naming the aggregate."""

    @abstractmethod
    def rejection(self, command: C, reason: str) -> D:
        """The payload recording that ``command`` was refused, for ``reason``."""

    @abstractmethod
    def senders(self, command: C) -> Senders:
        """Which kinds of principal may send ``command`` (:mod:`ffdl.core.authorization`)."""

    def tenant_of(self, item: E | C) -> str | None:
        """The tenant the aggregate belongs to; None for a kind that belongs to no tenant."""
        return None

    def owning_tenant(self, state: S | None, command: C) -> str | None:
        """The tenant the aggregate belongs to as its owner folded it (one ``command`` would create: the
        tenant it names), which a tenant's command must be; None for a kind that belongs to no tenant."""
        return None

    def ids(self, item: E | C) -> dict[str, str]:
        """The aggregate's id under the kind's name for it, for logs and reports."""
        return {self.id_field: self.identity(item)}


@dataclass(frozen=True, slots=True)
class Address(Generic[C, P]):
    """The aggregate a command is for: its command envelope (with payloads ``P``), and the fields
    that name the aggregate there."""

    envelope: Callable[..., C]
    fields: Mapping[str, str]

    def command(self, head: CommandHead, data: P) -> C:
        return self.envelope(**head, **self.fields, data=data)


@dataclass(slots=True)
class Decision(Generic[S, E, C, D]):
    """The events decided so far for one command, with the aggregate as they leave it."""

    kind: AggregateKind[S, E, C, D]
    command: C
    now: datetime
    producer: str
    state: S | None
    events: list[E] = field(default_factory=list)

    def emit(self, data: D, *, fenced: bool = True) -> S:
        """Append ``data`` as the aggregate's next event; a refusal is not fenced (it must not carry
        a deposed sender's token)."""
        command = self.command
        head: EventHead = {
            "event_id": derived_id(command.command_id, self.producer, len(self.events)),
            "seq": (self.state.seq if self.state is not None else 0) + 1,
            "occurred_at": self.now,
            "causation_id": command.command_id,
            "correlation_id": command.correlation_id or command.command_id,
            "producer": self.producer,
            "fencing_token": command.fencing_token if fenced else None,
        }
        event = self.kind.event(command, self.state, head, data)
        self.state = self.kind.evolve(self.state, event)
        self.events.append(event)
        return self.state

    def reject(self, reason: str) -> None:
        """Record that the command is refused, for ``reason`` cut to a reason's length: a refusal may
        quote what the sender chose, or a detail as long as a reason already is, and a refusal too
        long to be valid dead-lettered the command as an internal error instead."""
        self.emit(self.kind.rejection(self.command, within_reason(reason)), fenced=False)


class Skip(StrEnum):
    """Why a reader did not apply an event."""

    TAKEN = "taken"  # its seq is taken: a redelivered duplicate, or a conflict a stale owner wrote
    GAP = "gap"  # an event before it is missing
    ILLEGAL = "illegal"  # its aggregate's state does not allow it


@dataclass(frozen=True, slots=True)
class Skipped:
    why: Skip
    detail: str


def fold_step(kind: AggregateKind[S, E, Any, Any], state: S | None, event: E) -> S | Skipped:
    """The one step every reader folds an event with: the aggregate after ``event``, or why the
    event was skipped. A skipped event is never applied; the reader counts (or reports) it."""
    expected = state.seq + 1 if state is not None else 1
    if event.seq < expected:
        return Skipped(Skip.TAKEN, f"seq {event.seq} is taken")
    if event.seq > expected:
        return Skipped(Skip.GAP, f"expected seq {expected}, got {event.seq}")
    try:
        return kind.evolve(state, event)
    except EvolveError as exc:
        return Skipped(Skip.ILLEGAL, str(exc))


@dataclass(frozen=True, slots=True)
class Applied(Generic[S, E]):
    """An event a reader applied, with its kind and the aggregate before and after it."""

    kind: AggregateKind[S, E, Any, Any]
    event: E
    before: S | None
    after: S

    def of(self, kind: AggregateKind[S2, E2, Any, Any]) -> Applied[S2, E2] | None:
        """This, typed as ``kind``'s, when the event is one of ``kind``'s; else None."""
        return cast(Applied[S2, E2], self) if self.kind.name == kind.name else None


AnyKind = AggregateKind[Any, Any, Any, Any]


class Kinds:
    """A registry of aggregate kinds: the kind of any envelope, looked up by its class."""

    def __init__(self, *kinds: AnyKind) -> None:
        self._kinds = kinds
        self._by_envelope = {envelope: kind for kind in kinds for envelope in kind.envelopes}

    def __iter__(self) -> Iterator[AnyKind]:
        return iter(self._kinds)

    def find(self, item: object) -> AnyKind | None:
        """The kind of an event or command envelope; None for an envelope of no kind registered here."""
        return self._by_envelope.get(type(item))

    def of(self, item: object) -> AnyKind:
        kind = self.find(item)
        if kind is None:
            names = ", ".join(kind.name for kind in self._kinds)
            raise UnknownAggregate(f"a {type(item).__name__} is an envelope of no kind here ({names})")
        return kind


class Aggregates:
    """Aggregates of the registered kinds folded so far: one keyed book per kind, by aggregate id.

    Every event goes through :func:`fold_step`; an event of a kind not registered here is not
    folded (a reader of jobs only does not keep nodes).
    """

    def __init__(self, kinds: Kinds) -> None:
        self.kinds = kinds
        self._books: dict[str, dict[str, Any]] = {kind.name: {} for kind in kinds}

    def of(self, kind: AggregateKind[S, Any, Any, Any]) -> dict[str, S]:
        """The book of ``kind``: its aggregates by id."""
        return self._books[kind.name]

    def fold(self, event: EventEnvelope) -> Applied[Any, Any] | Skipped | None:
        """Fold one event into its aggregate; None when its kind is not registered here."""
        kind = self.kinds.find(event)
        if kind is None:
            return None
        book = self._books[kind.name]
        identity = kind.identity(event)
        before = book.get(identity)
        after = fold_step(kind, before, event)
        if isinstance(after, Skipped):
            return after
        book[identity] = after
        return Applied(kind, event, before, after)

    def copy(self) -> Aggregates:
        """Books of their own with the same aggregates, to fold on apart: an aggregate is an
        immutable value (every step makes a new one), so the copies share them."""
        copied = Aggregates(self.kinds)
        copied._books = {name: dict(book) for name, book in self._books.items()}
        return copied

    def forget(self, which: Iterable[tuple[str, str]]) -> Aggregates:
        """Drop the aggregates named (kind name, id); returns them, in a book of their own."""
        dropped = Aggregates(self.kinds)
        for kind_name, identity in which:
            dropped._books[kind_name][identity] = self._books[kind_name].pop(identity)
        return dropped
