"""Re-deciding a recorded log with today's deciders: ``ffdl verify --redecide``, as Temporal's ``Replayer``.

A job's or a node's owner decides each command with a pure decider on the state folded from the
events before it, so a log that holds the commands as well as the events can be decided again,
command by command, and today's decision compared with the one the log records. That is the check
to run before an upgrade: a command the new release decides differently is a job in flight across
the upgrade whose history would change course.

A re-decidable log is two JSON Lines files side by side, ``NAME.events.jsonl`` (what ``ffdl
export`` writes) and ``NAME.commands.jsonl``: one command per line as the commands topic carries it
(``command_to_json``), with the principal it was sent for (``principal``, from the record's header),
plus either where it sat (``topic``, ``position``: ``ffdl export --commands``) or how its owner
decided it (``decided_at``, ``decided_by``, ``leader_token``: the golden logs under ``tests/golden``,
which the recorder writes with :func:`command_line`).

Each command is decided as the owner decides it, through the gate of :mod:`ffdl.core.authorization`:
for its principal, and an allocation against the cluster as the log shows it just before the events
the allocation caused (the nodes and the GPUs held, folded from every event before them in the file's
order, which is the log's: an export merges the partitions by event time). A command without a
principal (recorded before there were principals) is decided for the principal an upgrading owner
derives from its producer (:func:`~ffdl.core.authorization.legacy_principal`).

Each command is matched with the events it caused by their ``causation_id``: on the command's key,
the run of events at the point the previous commands left off. Where the file does not say how the
owner decided a command, its events do: the owner's clock is their ``occurred_at``, the owner their
``producer``. The leader's token the owner checked a fenced command against is the command's own
when the decision was anything but a refusal (a deposed sender's command is refused); a refusal of
a fenced command is tried every way, since the log cannot tell a deposed sender, a sender when no
scheduler led (the election's lease had lapsed) and an illegal request apart. A command that
caused no event was decided to nothing (a repeat, a stale observation) and must be re-decided to
nothing, on its own ``issued_at``.

Three things are told apart from a divergence:

* **Known changes of decision.** A deliberate change of what the deciders decide makes every log
  written before it diverge. :data:`DECISION_CHANGES` names each such change with the upcast of a
  decision recorded before it (as the codec upcasts an old schema version): a recorded decision
  whose upcast is today's decision is counted under the change's name, not as a divergence. The
  gate is such a change (``principals``): a command recorded without a principal that today's gate
  refuses (a reactor's admission, a scheduler's command checked against no leader, an allocation on
  a node the log never had) is decided again without the gate, as the release before it decided it,
  and counted under its name when that is the recorded decision. A checkpoint the owner refused as
  outside the job's checkpoint place (``checkpoint-places``) is one too: the place is the owner's
  configuration, not in the log, so checkpoints are decided with no place and such a refusal is
  taken for the owner's decision. So is a tenant's refused command to another tenant's job or to a node
  (``outsiders-dead-lettered``), once recorded there and now a dead letter.
* **Commands not decided yet.** The owner decides a partition's commands in offset order and commits
  after appending their events, so every command before the last one of its partition that caused
  an event was decided. A command after it that caused nothing may not have been read yet when the
  log was exported; if today's deciders would decide something for it, it is counted as undecided,
  not as a divergence. (An export reads the commands before the events, so every command it holds
  had its chance by the time the events are read.)
* **History before the commands.** An event whose cause is not in the commands file (a commands
  topic keeps less than the events topic) is folded as the state the file's commands start from.

Events every reader skips (a seq already taken, an event illegal in its state) are skipped here too,
with the very folds of :mod:`ffdl.tools.sre`, so the decision they belonged to shows the gap.

Concurrency: one pass by one thread; the whole log is held in memory, grouped by key.
"""

from __future__ import annotations

import difflib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

import structlog

from ffdl.core.aggregate import Aggregates, UnknownAggregate
from ffdl.core.authorization import Principal, decide_as, legacy_principal, outsider
from ffdl.core.cluster_view import VIEW_EVENT_TYPES, ClusterView
from ffdl.core.decider import launch_on_allocation
from ffdl.core.job import Job, evolve
from ffdl.core.kinds import JOBS, KINDS, NODES, aggregate_kinds
from ffdl.core.nodes import NodeRecord
from ffdl.core.restart import RestartPolicy
from ffdl.core.tenancy import PriorityCeilings
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import (
    AnyCommand,
    AnyEvent,
    DecodeError,
    JsonObject,
    any_command_from_json,
    command_to_json,
    event_to_dict,
)
from ffdl.events.envelope import Command, Event
from ffdl.events.ids import derived_id
from ffdl.events.position import Position
from ffdl.handlers.messaging import Topics, misrouted, principal_of
from ffdl.projections.documents import dumps
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import (
    EventFilter,
    LogFileError,
    json_line,
    numbered_lines,
    open_for_reading,
    read_log,
)
from ffdl.tools.log_reading import UndecodableRecord
from ffdl.tools.sre import fold_until, started_bus
from ffdl.wiring.config import Settings

log = structlog.get_logger(__name__)

EVENTS_SUFFIX = ".events.jsonl"
COMMANDS_SUFFIX = ".commands.jsonl"
#: The leader token the owner sees when it cannot read the election: never a sender's token.
NOT_THE_SENDERS = -1


def commands_topic(settings: Settings) -> str:
    return Topics.with_prefix(settings.topic_prefix).commands


def commands_beside(events_path: Path | str) -> Path:
    """The commands file of an events file: ``NAME.commands.jsonl`` beside ``NAME.events.jsonl``."""
    path = Path(events_path)
    if not path.name.endswith(EVENTS_SUFFIX) or path.name == EVENTS_SUFFIX:
        raise ValueError(
            f"name the events file NAME{EVENTS_SUFFIX} ({path.name!r} is not), so that its commands "
            f"are NAME{COMMANDS_SUFFIX} beside it"
        )
    return path.with_name(path.name.removesuffix(EVENTS_SUFFIX) + COMMANDS_SUFFIX)


# -- the commands file ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decided:
    """How an owner decided a command: on its clock, under its name, against the leader's token."""

    at: datetime
    by: str
    leader_token: int | None

    def as_json(self) -> JsonObject:
        return {"decided_at": self.at.isoformat(), "decided_by": self.by, "leader_token": self.leader_token}


@dataclass(frozen=True, slots=True)
class RecordedCommand:
    """One line of a commands file: the command, whom it was sent for (None: recorded before there
    were principals), and where it sat or how it was decided, as written."""

    command: AnyCommand
    line: int = 0
    position: tuple[int, int] | None = None
    decided: Decided | None = None
    principal: Principal | None = None

    @property
    def sent_for(self) -> Principal:
        """The principal the owner decides the command for: the recorded one, else its producer's."""
        return self.principal or legacy_principal(self.command)

    @property
    def position_text(self) -> str | None:
        """``PARTITION:OFFSET`` on the commands topic, where the file says."""
        return f"{self.position[0]}:{self.position[1]}" if self.position else None

    @property
    def where(self) -> str:
        at = f" (position {self.position_text})" if self.position else ""
        return f"commands line {self.line}{at}"


def command_line(command: AnyCommand, **extra: object) -> str:
    """One line of a commands file: the command's JSON as on the topic plus ``extra`` keys, sorted."""
    return dumps({**json.loads(command_to_json(command)), **extra})


def decided_line(item: RecordedCommand) -> str:
    """A command with how its owner decided it (and whom it was sent for), the way a golden log records it."""
    if item.decided is None:
        raise ValueError(f"{item.where}: how {item.command.command_id} was decided is not known")
    sent_for = {"principal": str(item.principal)} if item.principal is not None else {}
    return command_line(item.command, **item.decided.as_json(), **sent_for)


def decode_command_line(text: str, number: int = 0) -> RecordedCommand:
    """One line of a commands file: the command, where it was, and how it was decided if recorded."""
    raw = json_line(text, number)
    position = raw.pop("position", None)
    principal = raw.pop("principal", None)
    try:
        decided = None
        if "decided_at" in raw:
            at = datetime.fromisoformat(raw.pop("decided_at"))
            decided = Decided(at, raw.pop("decided_by"), raw.pop("leader_token"))
        command = any_command_from_json(json.dumps(raw))
        where = Position.parse_token(position) if position is not None else None
        sent_for = Principal.parse(principal) if principal is not None else None
    except (DecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogFileError(number, f"not a recorded command: {exc}") from exc
    return RecordedCommand(command, number, where, decided, sent_for)


def read_commands(path: Path | str) -> Iterator[RecordedCommand]:
    """Every command of a commands file, in file order; raises :class:`LogFileError` at a bad line."""
    with open_for_reading(path) as stream:
        for number, text in numbered_lines(stream):
            yield decode_command_line(text, number)


async def export_commands(bus_url: str, partitions: int, topic: str, out: TextIO) -> JsonObject:
    """Write every command of ``topic`` that its owner decides to ``out``, partition after partition.

    A record the owner dead-letters instead of deciding (undecodable, a key that is not the command's,
    a wrong partition, a principal header that names no principal) is no line: it is listed
    (``dead_lettered``: position, key, reason). Each line names the principal the owner decided the
    command for (its header's, or an older producer's as the owner derives it).
    """
    bus = await started_bus(bus_url, partitions, topic)
    written, skipped = 0, []
    try:
        for partition in sorted(await bus.end_offsets(topic)):
            async for record in bus.read(topic, partition):
                try:
                    command = any_command_from_json(record.value)
                    reason = misrouted(record, command, bus.partition_for(record.key))
                    principal = principal_of(record, command)
                except DecodeError as exc:
                    reason = exc.reason
                except ValueError as exc:
                    reason = str(exc)
                if reason:
                    skipped.append(UndecodableRecord(partition, record.offset, record.key, reason))
                    continue
                where = f"{partition}:{record.offset}"
                out.write(command_line(command, topic=topic, position=where, principal=str(principal)) + "\n")
                written += 1
    finally:
        await bus.close()
    log.info("commands exported", bus=bus_url, topic=topic, written=written, dead_lettered=len(skipped))
    return {"topic": topic, "written": written, "dead_lettered": [record.as_json() for record in skipped]}


async def export_commands_beside(
    events_output: str, bus_url: str, settings: Settings, keep: EventFilter
) -> JsonObject:
    """``ffdl export --commands``: the commands topic to ``NAME.commands.jsonl`` beside ``events_output``.

    It runs before the events are read, so that every command it writes had its chance to be decided
    by the time they are (see the module's notes on commands not decided yet). A re-decidable log is
    the whole log: a filter would leave out the events some commands are decided on, so none is taken.
    """
    if keep != EventFilter():
        raise ValueError("--commands exports the whole log, for 'verify --redecide': leave out the filters")
    path = commands_beside(events_output)
    with path.open("w", encoding="utf-8") as out:
        report = await export_commands(bus_url, settings.partitions, commands_topic(settings), out)
    return {**report, "path": str(path)}


# -- known changes of decision ----------------------------------------------------------------------

#: An aggregate as its owner folds it.
State = Job | NodeRecord
#: The upcast of a decision recorded before a change: today's form of it, or None where it does not apply.
Upcast = Callable[[State | None, RecordedCommand, Sequence[AnyEvent]], list[AnyEvent] | None]


@dataclass(frozen=True, slots=True)
class DecisionChange:
    """A deliberate change of what the deciders decide, with the upcast of a decision made before it;
    or (``upcast`` None) a change of the owner's gate, before which a command was decided without it."""

    name: str
    upcast: Upcast | None = None


def _launch_in_the_allocation(
    before: State | None, item: RecordedCommand, recorded: Sequence[AnyEvent]
) -> list[AnyEvent] | None:
    """``AllocateGpus`` decided before the owner launched in the allocation's own decision.

    The older owner appended ``GpusAllocated`` alone and launched when the reactor's ``BeginLaunch``
    came; today's appends the same ``JobLaunching`` (the next attempt, from the latest checkpoint)
    right after it. The recorded log keeps its ``BeginLaunch``, which today's decider still launches
    from SCHEDULED, so the rest of the log re-decides as recorded.
    """
    command = item.command
    if not (
        isinstance(before, Job)
        and isinstance(command.data, cmd.AllocateGpus)
        and len(recorded) == 1
        and isinstance(recorded[0], Event)
        and isinstance(recorded[0].data, ev.GpusAllocated)
    ):
        return None
    allocated = recorded[0]
    launching = allocated.model_copy(
        update={
            "event_id": derived_id(command.command_id, allocated.producer, 1),
            "seq": allocated.seq + 1,
            "data": launch_on_allocation(evolve(before, allocated)),
        }
    )
    return [allocated, launching]


def _refused_outside_the_place(
    before: State | None, item: RecordedCommand, recorded: Sequence[AnyEvent]
) -> list[AnyEvent] | None:
    """A ``ReportCheckpoint`` the owner refused as outside the job's checkpoint place.

    The place is the owner's configuration (the learners' root, ``FFDL_CHECKPOINT_PLACE``), which
    the log does not hold, so the re-decider decides checkpoints with no place and takes the owner's
    refusal, recognised by its reason, for the decision the owner made with its place.
    """
    command = item.command
    if not (
        isinstance(before, Job)
        and isinstance(command, Command)
        and isinstance(command.data, cmd.ReportCheckpoint)
        and len(recorded) == 1
        and isinstance(recorded[0], Event)
        and isinstance(recorded[0].data, ev.CommandRejected)
        and recorded[0].data.reason.startswith(f"checkpoint {command.data.checkpoint.uri!r:.300} refused: ")
    ):
        return None
    at, owner = recorded[0].occurred_at, recorded[0].producer
    return list(JOBS.decide(before, command, at, producer=owner, leader_token=None))


def _outsider_refused_in_the_history(
    before: State | None, item: RecordedCommand, recorded: Sequence[AnyEvent]
) -> list[AnyEvent] | None:
    """A tenant's command to an aggregate not its own (another tenant's job, a node), refused.

    The owner recorded the refusal as the aggregate's rejection event; today's dead-letters it
    (:func:`~ffdl.core.authorization.outsider`), so it decides nothing on the log.
    """
    if (
        before is None
        or len(recorded) != 1
        or not isinstance(recorded[0].data, ev.CommandRejected | nd.NodeCommandRejected)
        or not outsider(item.sent_for, KINDS.of(item.command), before, item.command)
    ):
        return None
    return []


#: The owner's gate (:func:`~ffdl.core.authorization.decide_as`): who may send what, the scheduler's
#: commands only with the leader's token, allocations checked against the cluster. A command recorded
#: without a principal was decided by a release without the gate.
PRINCIPALS = DecisionChange("principals")

#: Every deliberate change of decision a log written by an older release may show, oldest first.
DECISION_CHANGES: tuple[DecisionChange, ...] = (
    DecisionChange("launch-in-allocation", _launch_in_the_allocation),
    PRINCIPALS,
    DecisionChange("checkpoint-places", _refused_outside_the_place),
    DecisionChange("outsiders-dead-lettered", _outsider_refused_in_the_history),
)


# -- re-deciding ------------------------------------------------------------------------------------


def _dicts(events: Sequence[AnyEvent]) -> list[JsonObject]:
    return [event_to_dict(event) for event in events]


@dataclass(frozen=True, slots=True)
class Divergence:
    """A command that today's deciders decide otherwise than the log records."""

    recorded_command: RecordedCommand
    decided: Decided
    recorded: list[AnyEvent]
    redecided: list[AnyEvent]

    def diff(self) -> list[str]:
        def pretty(events: Sequence[AnyEvent]) -> list[str]:
            return json.dumps(_dicts(events), indent=2, sort_keys=True).splitlines()

        lines = difflib.unified_diff(
            pretty(self.recorded), pretty(self.redecided), "recorded", "redecided", lineterm=""
        )
        return list(lines)

    def headline(self) -> str:
        command, decided = self.recorded_command.command, self.decided
        return (
            f"{self.recorded_command.where}: {command.type} {command.command_id} on {_aggregate(command)}, "
            f"decided at {decided.at.isoformat()} by {decided.by} (leader token {decided.leader_token})"
        )

    def as_json(self) -> JsonObject:
        recorded = self.recorded_command
        return {
            "kind": "decision",
            "summary": self.headline(),
            "line": recorded.line,
            "position": recorded.position_text,
            "command": json.loads(command_to_json(recorded.command)),
            **self.decided.as_json(),
            "recorded": _dicts(self.recorded),
            "redecided": _dicts(self.redecided),
            "diff": self.diff(),
        }


@dataclass(frozen=True, slots=True)
class StrayEvent:
    """An event caused by a command of the file that none of that command's decisions accounts for."""

    logged: LoggedEvent

    def headline(self) -> str:
        event = self.logged.event
        return (
            f"events position {self.logged.position}: {event.type} seq {event.seq} of {_aggregate(event)} "
            f"was caused by command {event.causation_id}, which did not decide it there"
        )

    def as_json(self) -> JsonObject:
        return {
            "kind": "stray-event",
            "summary": self.headline(),
            "position": self.logged.position,
            "event": event_to_dict(self.logged.event),
        }


@dataclass
class Redecided:
    """What re-deciding a log found, and the jobs and nodes folded from its recorded events."""

    commands: int = 0
    events: int = 0
    matched: int = 0
    changes: Counter[str] = field(default_factory=Counter)
    undecided: list[RecordedCommand] = field(default_factory=list)
    history: int = 0
    skipped: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    strays: list[StrayEvent] = field(default_factory=list)
    jobs: dict[str, Job] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)

    @property
    def diverged(self) -> int:
        return len(self.divergences) + len(self.strays)

    def as_json(self) -> JsonObject:
        first = self.divergences[0] if self.divergences else (self.strays[0] if self.strays else None)
        return {
            "commands": self.commands,
            "events": self.events,
            "matched": self.matched,
            "known_changes": dict(sorted(self.changes.items())),
            "undecided": [item.where for item in self.undecided],
            "history_without_commands": self.history,
            "skipped": self.skipped,
            "divergences": self.diverged,
            "first_divergence": first.as_json() if first else None,
        }


def _aggregate(item: AnyCommand | AnyEvent) -> str:
    """The job or node a command or event is about, in words."""
    kind = KINDS.of(item)
    return f"{kind.name} {kind.identity(item)}"


def _histories(events: Iterable[LoggedEvent]) -> tuple[dict[str, list[LoggedEvent]], int, int]:
    """Each key's events as every reader folds them, how many events were read and how many skipped."""
    by_key: dict[str, list[LoggedEvent]] = {}
    read = 0
    for logged in events:
        by_key.setdefault(logged.event.key, []).append(logged)
        read += 1
    applied: dict[str, list[LoggedEvent]] = {}
    skipped = 0
    for key, history in by_key.items():
        folded = fold_until(history, KINDS.of(history[0].event))
        applied[key] = list(folded.applied)
        skipped += len(folded.skipped)
    return applied, read, skipped


def _decided_ways(item: RecordedCommand, caused: Sequence[AnyEvent], owner: str) -> list[Decided]:
    """How the owner may have decided ``item``: as the file says, else as the events it caused tell."""
    if item.decided is not None:
        return [item.decided]
    command = item.command
    at, by = (caused[0].occurred_at, caused[0].producer) if caused else (command.issued_at, owner)
    token = command.fencing_token
    leads = Decided(at, by, token)
    refused = len(caused) == 1 and isinstance(caused[0].data, ev.CommandRejected | nd.NodeCommandRejected)
    if token is not None and refused:
        # another scheduler led, or the owner could not read the election, or none led (the
        # leader's lease had lapsed, as in an etcd outage longer than its TTL)
        return [leads, Decided(at, by, NOT_THE_SENDERS), Decided(at, by, None)]
    return [leads]


def _maybe_undecided(commands: Sequence[RecordedCommand], causes: set[uuid.UUID | None]) -> set[int]:
    """The indexes of exported commands after the last one of their partition that caused an event."""
    last: dict[int, int] = {}
    for index, item in enumerate(commands):
        if item.position is not None and item.command.command_id in causes:
            last[item.position[0]] = index
    return {
        index
        for index, item in enumerate(commands)
        if item.position is not None and index > last.get(item.position[0], -1)
    }


class _ClusterTimeline:
    """The cluster as the owner saw it at any point of the log: the view of the events before it.

    The events are the log's in file order; :meth:`at` folds the view forward, and from the start
    again only when asked for an earlier point (an export lists the commands partition by partition,
    so each partition's commands go back to the log's start once).
    """

    def __init__(self, events: Sequence[LoggedEvent]) -> None:
        self._events = [
            (index, logged.event)
            for index, logged in enumerate(events)
            if logged.event.type in VIEW_EVENT_TYPES
        ]
        self._view = ClusterView()
        self._next = 0  # in self._events
        self._point = 0

    def at(self, point: int) -> ClusterView:
        """The view of the events before file index ``point``."""
        if point < self._point:
            self._view, self._next = ClusterView(), 0
        while self._next < len(self._events) and self._events[self._next][0] < point:
            self._view.apply(self._events[self._next][1])
            self._next += 1
        self._point = point
        return self._view


class _Folded:
    """The jobs and nodes folded so far from the recorded events, and the one decision step on them."""

    def __init__(self, policy: RestartPolicy, ceilings: PriorityCeilings | None) -> None:
        self.kinds = aggregate_kinds(policy)
        self.book = Aggregates(self.kinds)
        self.ceilings = ceilings

    def state(self, command: AnyCommand) -> State | None:
        kind = self.kinds.of(command)
        state: State | None = self.book.of(kind).get(kind.identity(command))
        return state

    def decide(
        self, item: RecordedCommand, way: Decided, cluster: ClusterView, *, gated: bool = True
    ) -> list[AnyEvent]:
        """Today's decision, through the owner's gate (``gated``: False, as a release before it decided);
        a command the owner dead-letters (an unknown job or node, a refused creation) decides nothing."""
        command = item.command
        kind = self.kinds.of(command)
        state = self.state(command)
        try:
            if not gated:
                return [*kind.decide(state, command, way.at, producer=way.by, leader_token=way.leader_token)]
            decided = decide_as(
                kind,
                state,
                command,
                way.at,
                principal=item.sent_for,
                producer=way.by,
                leader_token=way.leader_token,
                outside=cluster.refusal,
                ceilings=self.ceilings,
            )
            return [*decided]
        except UnknownAggregate:
            return []

    def apply(self, event: AnyEvent) -> None:
        """Fold one recorded event (the histories hold only events every reader applies)."""
        self.book.fold(event)


def redecide(
    commands: Iterable[RecordedCommand],
    events: Iterable[LoggedEvent],
    policy: RestartPolicy,
    changes: Sequence[DecisionChange] = DECISION_CHANGES,
    ceilings: PriorityCeilings | None = None,
) -> Redecided:
    """Decide every command again, each on its job or node folded from the recorded events before it,
    and compare with the events the log records for it; ``changes``: the known changes of decision;
    ``ceilings``: the tenants' priority ceilings the owner held submissions to (they are the tenants
    file's, not the log's: without them a submission refused for its priority diverges)."""
    items = list(commands)
    logged_events = list(events)
    index_of = {(logged.partition, logged.offset): index for index, logged in enumerate(logged_events)}
    timeline = _ClusterTimeline(logged_events)
    histories, read, skipped = _histories(logged_events)
    causes = {logged.event.causation_id for history in histories.values() for logged in history}
    in_file = {item.command.command_id for item in items}
    maybe_undecided = _maybe_undecided(items, causes)
    found = Redecided(commands=len(items), events=read, skipped=skipped)
    folded = _Folded(policy, ceilings)
    cursor = dict.fromkeys(histories, 0)
    owner = "owner"
    for index, item in enumerate(items):
        command = item.command
        history = histories.get(command.key, [])
        start = cursor.get(command.key, 0)
        while start < len(history) and history[start].event.causation_id not in in_file:
            folded.apply(history[start].event)
            found.history += 1
            start += 1
        end = start
        while end < len(history) and history[end].event.causation_id == command.command_id:
            end += 1
        recorded = [logged.event for logged in history[start:end]]
        owner = recorded[0].producer if recorded else owner
        # The cluster just before what the command caused (or, if nothing, whatever came next on its key).
        following = history[start] if start < len(history) else None
        point = index_of[(following.partition, following.offset)] if following else len(logged_events)
        cluster = timeline.at(point) if isinstance(command.data, cmd.AllocateGpus) else ClusterView()
        ways = _decided_ways(item, recorded, owner)
        outcome = _compare(folded, item, recorded, ways, changes, cluster)
        if isinstance(outcome, str):
            found.matched += outcome == ""
            found.changes.update([outcome] if outcome else [])
        elif index in maybe_undecided and not recorded:
            found.undecided.append(item)
        else:
            found.divergences.append(outcome)
        for event in recorded:
            folded.apply(event)
        cursor[command.key] = end
    for key, history in histories.items():
        for logged in history[cursor[key] :]:
            if logged.event.causation_id in in_file:
                found.strays.append(StrayEvent(logged))
            else:
                found.history += 1
            folded.apply(logged.event)
    found.jobs, found.nodes = folded.book.of(JOBS), folded.book.of(NODES)
    return found


def _compare(
    folded: _Folded,
    item: RecordedCommand,
    recorded: list[AnyEvent],
    ways: Sequence[Decided],
    changes: Sequence[DecisionChange],
    cluster: ClusterView,
) -> str | Divergence:
    """``""`` when today's decision is the recorded one, a change's name when it is the recorded one
    upcast through that change, or, for a command recorded before the gate, the gate's name when the
    decision without it is the recorded one (upcast or not); else the divergence (in the likeliest of
    ``ways`` it was decided)."""
    before = folded.state(item.command)
    upcasts = [change for change in changes if change.upcast is not None]
    gates = [change for change in changes if change.upcast is None] if item.principal is None else []
    first: Divergence | None = None
    for gate in [None, *gates]:
        for way in ways:
            redecided = folded.decide(item, way, cluster, gated=gate is None)
            name = _explained(before, item, recorded, _dicts(redecided), upcasts)
            if name is not None:
                return gate.name if gate is not None else name
            first = first or Divergence(item, way, recorded, redecided)
    assert first is not None
    return first


def _explained(
    before: State | None,
    item: RecordedCommand,
    recorded: list[AnyEvent],
    actual: list[JsonObject],
    upcasts: Sequence[DecisionChange],
) -> str | None:
    """``""`` when ``actual`` is the recorded decision, the name of the change whose upcast of it is
    ``actual``, else None."""
    if _dicts(recorded) == actual:
        return ""
    for change in upcasts:
        upcast = change.upcast(before, item, recorded) if change.upcast is not None else None
        if upcast is not None and _dicts(upcast) == actual:
            return change.name
    return None


def redecide_files(
    events_path: Path | str, policy: RestartPolicy, ceilings: PriorityCeilings | None = None
) -> JsonObject:
    """:func:`redecide` over ``NAME.events.jsonl`` and the ``NAME.commands.jsonl`` beside it."""
    commands_path = commands_beside(events_path)
    found = redecide(read_commands(commands_path), read_log(events_path), policy, ceilings=ceilings)
    log.info("log re-decided", events=str(events_path), commands=found.commands, divergences=found.diverged)
    return {
        "events_file": str(events_path),
        "commands_file": str(commands_path),
        "restart_policy": asdict(policy),
        **found.as_json(),
    }


def report_lines(report: JsonObject) -> list[str]:
    """A re-decision report in words: the counts, then the first divergence with its diff."""
    changes = ", ".join(f"{name} {count}" for name, count in report["known_changes"].items())
    lines = [
        f"{report['commands_file']}: {report['commands']} commands re-decided against {report['events']} "
        f"events: {report['matched']} as recorded, "
        f"{sum(report['known_changes'].values())} through known changes ({changes or 'none'}), "
        f"{len(report['undecided'])} not decided yet, {report['divergences']} divergence(s)"
    ]
    first = report["first_divergence"]
    return (
        lines if first is None else [*lines, f"first divergence: {first['summary']}", *first.get("diff", [])]
    )
