"""The contract of ffdl: every event and command, its envelope, its versions and its wire format.

This package imports nothing else of ours: services that publish commands, SREs reading exported
logs and our own handlers all speak through these types alone.
"""

from ffdl.events.codec import (
    AnyCommand,
    AnyEvent,
    DecodeError,
    any_command_from_json,
    any_event_from_json,
    command_from_json,
    command_to_json,
    event_from_json,
    event_to_json,
)
from ffdl.events.envelope import (
    Command,
    CommandData,
    Event,
    EventData,
    NodeCommand,
    NodeCommandData,
    NodeEvent,
    NodeEventData,
    node_key,
)
from ffdl.events.ids import derived_id
from ffdl.events.job_commands import COMMAND_TYPES
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    FailureKind,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    ResultSummary,
)
from ffdl.events.nodes import NODE_COMMAND_TYPES, NODE_EVENT_TYPES, NodeSpec

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "NODE_COMMAND_TYPES",
    "NODE_EVENT_TYPES",
    "AnyCommand",
    "AnyEvent",
    "Checkpoint",
    "Command",
    "CommandData",
    "DecodeError",
    "ErrorCode",
    "Event",
    "EventData",
    "FailureKind",
    "JobSpec",
    "LearnerPlacement",
    "LossReason",
    "NodeCommand",
    "NodeCommandData",
    "NodeEvent",
    "NodeEventData",
    "NodeSpec",
    "Placement",
    "ResultSummary",
    "any_command_from_json",
    "any_event_from_json",
    "command_from_json",
    "command_to_json",
    "derived_id",
    "event_from_json",
    "event_to_json",
    "node_key",
]
