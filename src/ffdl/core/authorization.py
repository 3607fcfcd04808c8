"""Who may send which command: principals, the owner's authorization policy, and the gate every decision
passes.

Every command on the log is attributed to a :class:`Principal`, and the owner decides with the
principal, never with what the command says about itself (its ``producer``, its ``tenant``). Where
the principal comes from is the transport's business (``docs/security.md``): the platform's commands
topic carries it in a record header that only the platform's own processes can write, and a record
on a tenant's ingress topic is that tenant's whatever it says. This module is what the owner does
with it:

* :func:`job_senders` and :data:`NODE_SENDERS` say which kinds of principal may send each command.
  A tenant acts only on its own tenant's jobs, and only as a user does (submit, halt, resume, cancel,
  delete, and its learners' telemetry); admins (operators) may do that on any tenant's jobs and
  cordon, drain, observe and remove nodes; the scheduler alone admits, rejects, allocates, preempts
  and records why a job waits, and records what the inventory shows; the platform's other roles
  alone report learners, launch, store and release.
* A tenant's ``SubmitJob`` above its priority ceiling (:mod:`ffdl.core.tenancy`, from the tenants
  file the owner is given) is refused: a higher class would preempt other tenants' jobs.
* The scheduler's authority is its lease: each of its commands counts only with the current leader's
  fencing token. A missing token is a refusal, as is a token when no scheduler leads.
* :func:`decide_as` is the owner's decision: a redelivered command decides nothing; a command its
  principal may not send, or whose effect outside its aggregate is not possible (``outside``: a
  placement on a node or GPUs the cluster does not have free), is refused, recorded as the kind's
  rejection event when the aggregate exists, else raised as :class:`Unauthorized` (a dead letter);
  anything else goes to the kind's decider. A tenant's refused command to an aggregate not its own
  (another tenant's job, a node) is a dead letter too: it writes nothing into a history others read.
* :func:`legacy_principal` is what a command without a principal means: one an older release
  recorded, or one an older producer sends during an upgrade. Only the platform's own role names
  count (only the platform may write the commands topic), and never for more than the command's
  body can show: the API's job commands act for the tenant the body names (an admin's included,
  since the API writes the job's own tenant there), its node commands for an admin (the API sends
  them only for admins); anything else is :data:`ANONYMOUS` and may send nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from ffdl.core.aggregate import (
    AggregateKind,
    AggregateState,
    CommandEnvelope,
    Decision,
    EventEnvelope,
    UnknownAggregate,
    seen,
)
from ffdl.core.tenancy import PriorityCeilings, priority_problem
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.envelope import Command, CommandData, NodeCommand, NodeCommandData

S = TypeVar("S", bound=AggregateState)
C = TypeVar("C", bound=CommandEnvelope)
E = TypeVar("E", bound=EventEnvelope)

#: A principal's name: a tenant's (a DNS label, as ``ffdl tenants add`` makes them) or a role's.
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")


class PrincipalKind(StrEnum):
    TENANT = "tenant"  # a tenant: through the API with its token, or on its own ingress topic
    ADMIN = "admin"  # an operator: an admin of the API
    SCHEDULER = "scheduler"  # the scheduler role: its commands count only with the leader's token
    PLATFORM = "platform"  # the platform's other roles: reactor, monitor, pod watcher
    ANONYMOUS = "anonymous"  # nobody the owner can name: may send nothing


#: Who may send a command.
Senders = frozenset[PrincipalKind]

_SPOKEN = {
    PrincipalKind.TENANT: "its tenant",
    PrincipalKind.ADMIN: "admins",
    PrincipalKind.SCHEDULER: "the scheduler",
    PrincipalKind.PLATFORM: "the platform's roles",
    PrincipalKind.ANONYMOUS: "anonymous senders",
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a command: a kind, and a name (a tenant's, an admin's, a platform role's; empty when
    none is known or needed). Written ``kind:name`` (``tenant:acme``, ``platform:reactor``) or
    ``kind`` alone (``scheduler``)."""

    kind: PrincipalKind
    name: str = ""

    @classmethod
    def tenant(cls, name: str) -> Principal:
        return cls(PrincipalKind.TENANT, name)

    @classmethod
    def admin(cls, name: str = "") -> Principal:
        return cls(PrincipalKind.ADMIN, name)

    @classmethod
    def platform(cls, role: str) -> Principal:
        return cls(PrincipalKind.PLATFORM, role)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else str(self.kind)

    @classmethod
    def parse(cls, text: str) -> Principal:
        """The principal written ``text``; raises ValueError for anything else."""
        kind_text, _, name = text.partition(":")
        try:
            kind = PrincipalKind(kind_text)
        except ValueError:
            raise ValueError(f"{text!r} names no kind of principal ({', '.join(PrincipalKind)})") from None
        if kind is PrincipalKind.TENANT and not name:
            raise ValueError(f"{text!r}: a tenant principal needs the tenant's name")
        if name and kind in (PrincipalKind.SCHEDULER, PrincipalKind.ANONYMOUS):
            raise ValueError(f"{text!r}: a {kind} principal has no name")
        if name and not _NAME.match(name):
            raise ValueError(f"{text!r}: {name!r} is not a tenant's or a role's name")
        return cls(kind, name)


SCHEDULER = Principal(PrincipalKind.SCHEDULER)
ANONYMOUS = Principal(PrincipalKind.ANONYMOUS)

_USERS: Senders = frozenset({PrincipalKind.TENANT, PrincipalKind.ADMIN})
_SCHEDULER: Senders = frozenset({PrincipalKind.SCHEDULER})
_PLATFORM: Senders = frozenset({PrincipalKind.PLATFORM})
_INVENTORY: Senders = frozenset({PrincipalKind.SCHEDULER, PrincipalKind.ADMIN})

#: Who may send each job command (``HaltJob``: see :func:`job_senders`).
JOB_SENDERS: Mapping[type[CommandData], Senders] = {
    cmd.SubmitJob: _USERS,
    cmd.HaltJob: _USERS,
    cmd.ResumeJob: _USERS,
    cmd.CancelJob: _USERS,
    cmd.DeleteJob: _USERS,
    cmd.ReportProgress: frozenset({PrincipalKind.TENANT, PrincipalKind.PLATFORM}),  # learners' telemetry
    cmd.AdmitJob: _SCHEDULER,
    cmd.RejectJob: _SCHEDULER,
    cmd.AllocateGpus: _SCHEDULER,
    cmd.RecordWaitReason: _SCHEDULER,
    cmd.BeginLaunch: _PLATFORM,
    cmd.ReportLearnerStarted: _PLATFORM,
    cmd.ReportCheckpoint: _PLATFORM,
    cmd.ReportLearnerExited: _PLATFORM,
    cmd.ReportLearnerLost: _PLATFORM,
    cmd.FinishStoring: _PLATFORM,
    cmd.ReleaseGpus: _PLATFORM,
}

#: Who may send each node command: operators, and the scheduler leader recording its inventory.
NODE_SENDERS: Mapping[type[NodeCommandData], Senders] = {
    nd.CordonNode: frozenset({PrincipalKind.ADMIN}),
    nd.UncordonNode: frozenset({PrincipalKind.ADMIN}),
    nd.ObserveNode: _INVENTORY,
    nd.ReportNodeLost: _INVENTORY,
    nd.RemoveNode: _INVENTORY,
}


def job_senders(data: CommandData) -> Senders:
    """Who may send a job command with payload ``data``: a halt that requeues is a preemption, the
    scheduler's alone; any other halt is a user's."""
    if isinstance(data, cmd.HaltJob) and data.requeue:
        return _SCHEDULER
    return JOB_SENDERS.get(type(data), frozenset())


def node_senders(data: NodeCommandData) -> Senders:
    return NODE_SENDERS.get(type(data), frozenset())


class Unauthorized(UnknownAggregate):
    """A refused command the owner records in no aggregate's history, so dead-letters with the
    reason: one for an aggregate that does not exist, or a tenant's for one that is not its own
    (:func:`outsider`)."""


def fencing_problem(token: int | None, leader_token: int | None) -> str:
    """Why a scheduler's command fenced with ``token`` does not count (empty when it does)."""
    if token is None:
        return "the scheduler's commands count only with its fencing token: this one has none"
    if leader_token is None:
        return f"fencing token {token} cannot be the leader's: no scheduler leads"
    if token != leader_token:
        return f"fencing token {token} is not the leader's: sender was deposed"
    return ""


def refusal(
    principal: Principal,
    kind: AggregateKind[S, Any, C, Any],
    state: S | None,
    command: C,
    leader_token: int | None,
) -> str:
    """Why ``principal`` may not send ``command`` to the aggregate ``state`` (empty when it may)."""
    senders = kind.senders(command)
    if not senders:
        return f"nobody may send {command.type}"
    if principal.kind not in senders:
        allowed = " or ".join(_SPOKEN[sender] for sender in PrincipalKind if sender in senders)
        return f"{principal} may not send {command.type}: only {allowed} may"
    if principal.kind is PrincipalKind.TENANT and kind.owning_tenant(state, command) != principal.name:
        return f"{kind.name} belongs to another tenant than {principal.name!r}"
    if principal.kind is PrincipalKind.SCHEDULER:
        return fencing_problem(command.fencing_token, leader_token)
    if command.fencing_token is not None:
        # A tenant's token once became its job's: while no scheduler led it was taken for a leader's,
        # and with 2**62 every later leader's halt, allocation and drain of the job was refused as
        # a deposed sender's (and a token on a submission made `ffdl verify` report every scheduler
        # event of its partition as a fencing breach).
        return f"{principal} may not send a fencing token: only the scheduler's commands carry one"
    return ""


def outsider(principal: Principal, kind: AggregateKind[S, Any, C, Any], state: S | None, command: C) -> bool:
    """Whether ``principal`` is a tenant sending to an aggregate that is not its own: another
    tenant's job, or a node (nodes belong to no tenant). Its refusal is not recorded there: a
    tenant may not write into a history others read, not even refusals (200 refused cordons from
    one tenant were in every tenant's node history and every cluster view's fold)."""
    return principal.kind is PrincipalKind.TENANT and kind.owning_tenant(state, command) != principal.name


def above_ceiling(principal: Principal, command: object, ceilings: PriorityCeilings | None) -> str:
    """Why a tenant may not submit ``command`` at its priority (empty when it may): above its
    ceiling. Only a tenant's submissions are held to it; an admin's and the platform's are not."""
    data = getattr(command, "data", None)
    if ceilings is None or principal.kind is not PrincipalKind.TENANT or not isinstance(data, cmd.SubmitJob):
        return ""
    return priority_problem(principal.name, data.spec.priority, ceilings(principal.name))


def nothing_outside(state: object, command: object) -> str:
    """The outside check of an owner that checks nothing beyond the aggregate (a kind without one)."""
    return ""


#: Why a command's effect outside its aggregate is not possible now (empty when it is), from what
#: the owner knows of the rest of the platform: ``(state, command) -> reason``.
OutsideCheck = Callable[[Any, Any], str]


def decide_as(
    kind: AggregateKind[S, E, C, Any],
    state: S | None,
    command: C,
    now: datetime,
    *,
    principal: Principal,
    producer: str,
    leader_token: int | None,
    outside: OutsideCheck = nothing_outside,
    ceilings: PriorityCeilings | None = None,
) -> list[E]:
    """The owner's decision on ``command`` sent by ``principal``, as it appends it; ``ceilings``:
    the tenants' priority ceilings (None: none known, as when a log is decided again offline).

    A redelivered command decides nothing. A refused one (see the module's notes) is recorded as the
    kind's rejection when its aggregate exists and the sender is no :func:`outsider` to it; else
    :class:`Unauthorized` is raised.
    """
    if state is not None and seen(state, command.command_id):
        return []
    reason = (
        refusal(principal, kind, state, command, leader_token)
        or above_ceiling(principal, command, ceilings)
        or outside(state, command)
    )
    if not reason:
        return kind.decide(state, command, now, producer=producer, leader_token=leader_token)
    if state is None or outsider(principal, kind, state, command):
        raise Unauthorized(f"{command.type} from {principal} refused: {reason}")
    decision = Decision(kind, command, now, producer, state)
    decision.reject(reason)
    return decision.events


#: The producer names (before the ``@``) of the platform's roles that observe learners and drive jobs.
PLATFORM_ROLES = frozenset({"reactor", "monitor", "pods"})


def legacy_principal(command: Command | NodeCommand) -> Principal:
    """The principal of a command that carries none (see the module's notes), from its producer."""
    role = command.producer.partition("@")[0]
    if role == "scheduler":
        return SCHEDULER
    if role in PLATFORM_ROLES:
        return Principal.platform(role)
    # A job's command names its tenant; a node's names none (the old API sent those for admins only).
    tenant: str | None = getattr(command, "tenant", None)
    if tenant is not None and role in ("api", "mqtt"):
        return Principal.tenant(tenant)
    if tenant is None and role == "api":
        return Principal.admin()
    return ANONYMOUS
