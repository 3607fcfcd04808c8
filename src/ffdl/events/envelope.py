"""The envelope every event and command travels in (architecture §3).

Payloads are typed pydantic models; the envelope names their type and schema version, so the
decoder picks the payload class by ``type`` (a discriminated union) and upcasts old versions.
Event ids of derived events are deterministic (``events/ids.py``), so a replayed or redelivered
reaction yields the same ids and a reader can tell a duplicate from a conflict.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ffdl.events.model import Frozen

NODE_KEY_PREFIX = "node:"
#: What a new job's id may be: it names the job's directory, its checkpoint place and its URL
#: (``/v1/jobs/{job_id}``), so no ``/``, no ``..``, nothing a path or a URL would read otherwise.
#: The API's ids (``{name}-{8 hex}``) always match.
_NAME = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"  # a node's name is one too (NodeName)
JOB_ID_PATTERN = re.compile(rf"\A{_NAME}\Z")


class Payload(Frozen):
    """Base of every event and command payload; ``VERSION`` is bumped on any schema change."""

    VERSION: ClassVar[int] = 1

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__


class EventData(Payload):
    """Base of event payloads: facts the job's owner appended to the log."""


class CommandData(Payload):
    """Base of command payloads: requests and observations sent to the job's owner."""

    #: whether the command brings a new job into being (its id must then be a :data:`JOB_ID_PATTERN`)
    CREATES_JOB: ClassVar[bool] = False


class _Envelope(BaseModel):
    """What every envelope has: immutability, no unknown fields, and its payload's type and version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:  # each envelope declares its own payload field, of its own base type
        data: Payload

    @property
    def type(self) -> str:
        return self.data.type_name()

    @property
    def schema_version(self) -> int:
        return self.data.VERSION


class _EventEnvelope(_Envelope):
    """A fact on the log: numbered per aggregate, caused by a command, appended by its owner."""

    event_id: uuid.UUID
    seq: Annotated[int, Field(ge=1)]
    occurred_at: datetime
    causation_id: uuid.UUID | None = None
    correlation_id: uuid.UUID | None = None
    producer: str
    fencing_token: int | None = None


class _CommandEnvelope(_Envelope):
    """A request or an observation for one aggregate's owner, on the untrusted commands topic.

    ``fencing_token`` is set by singleton roles (the scheduler) elected through a lease; the owner
    refuses commands that carry a token that is not the current leader's.
    """

    command_id: uuid.UUID
    issued_at: datetime
    producer: Annotated[str, Field(min_length=1, max_length=200)]
    correlation_id: uuid.UUID | None = None
    fencing_token: int | None = None


class Event(_EventEnvelope):
    """One fact of a job on the log. ``seq`` numbers a job's events 1, 2, 3 ... with no gaps."""

    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    tenant: Annotated[str, Field(min_length=1, max_length=63)]
    data: EventData

    @property
    def key(self) -> str:
        """The log key: the job id (all of a job's records on one partition)."""
        return self.job_id


class Command(_CommandEnvelope):
    """A request or an observation addressed to one job's owner."""

    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    tenant: Annotated[str, Field(min_length=1, max_length=63)]
    data: CommandData

    @field_validator("job_id")
    @classmethod
    def _not_a_node_key(cls, value: str) -> str:
        if value.startswith(NODE_KEY_PREFIX):
            raise ValueError(f"a job id may not begin with {NODE_KEY_PREFIX!r}: that is a node's key")
        return value

    @model_validator(mode="after")
    def _new_job_id_names_a_place(self) -> Command:
        """A job enters the platform only with an id that names a directory and a URL (checked on
        the submission alone, whoever sends it: commands to a job submitted under older rules stay
        decodable, so it can still be cancelled)."""
        if self.data.CREATES_JOB and not JOB_ID_PATTERN.match(self.job_id):
            raise ValueError(
                "a new job's id must be letters, digits, '.', '_' and '-', beginning and ending "
                "with a letter or digit"
            )
        return self

    @property
    def key(self) -> str:
        return self.job_id


def node_key(node: str) -> str:
    """The log key of a node's commands and events: one partition, one owner, one order per node,
    as for a job; the prefix keeps node keys apart from job ids in the log's key space."""
    return f"{NODE_KEY_PREFIX}{node}"


#: A node name: a Kubernetes node name (DNS subdomain) or a host name.
NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=f"^{_NAME}$")]


class NodeEventData(Payload):
    """Base of node event payloads: facts about the inventory the node's owner appended to the log."""


class NodeCommandData(Payload):
    """Base of node command payloads: inventory observations and operator requests for one node."""


class NodeEvent(_EventEnvelope):
    """One fact about a node of the inventory; ``seq`` numbers a node's events.

    Nodes are aggregates like jobs (owned, numbered, fenced, on the same topics under the key
    :func:`node_key`), but they belong to no tenant, so they travel in an envelope of their own.
    """

    node: NodeName
    data: NodeEventData

    @property
    def key(self) -> str:
        return node_key(self.node)


class NodeCommand(_CommandEnvelope):
    """An inventory observation or an operator request addressed to one node's owner."""

    node: NodeName
    data: NodeCommandData

    @property
    def key(self) -> str:
        return node_key(self.node)
