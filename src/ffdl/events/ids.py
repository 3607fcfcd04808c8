"""Deterministic ids: what the platform derives instead of drawing, so doing a thing again gives the same id.

Each id is a name-based UUID (uuid5) of what identifies the thing. Redelivered, re-decided or re-run,
the same thing gets the same id: a reader tells a duplicate event from a conflicting one, and the
jobs' owners recognise a command they already decided (their window of recent command ids is folded
from the causation ids on the log).

Every derivation lives here, and a new one uses :data:`PLATFORM_NAMESPACE` with a name that starts
with its own kind (``"<kind>:..."``), so no two kinds of thing can share an id. Two derivations are
older than that rule and keep the namespaces they were born with: their ids are on the log already
(commands, and the causation ids of the events they caused), and a command sent again across an
upgrade must get the very id its first copy had, or the owner would decide it a second time.
"""

from __future__ import annotations

import uuid

#: The platform's namespace: the ids of the events a decider derives from a command are made in it.
PLATFORM_NAMESPACE = uuid.UUID("5f0c2a5e-6d1b-4c31-9a8e-0f5d0e7a1b2c")
# Frozen: the namespaces of reaction commands and pod reports, whose ids the owners' windows hold.
_REACTION_NAMESPACE = uuid.UUID("a3d2f1e0-58b4-4f0e-9c1d-7b6a5e4d3c2b")
_POD_REPORT_NAMESPACE = uuid.UUID("5d0c7c8e-2f0b-4a57-9d4e-6b1f3c2a8e71")


def derived_id(cause: uuid.UUID, producer: str, index: int) -> uuid.UUID:
    """The id of the ``index``-th event that ``producer`` derived from the command ``cause``."""
    return uuid.uuid5(PLATFORM_NAMESPACE, f"{cause}:{producer}:{index}")


def reaction_command_id(job_id: str, action: str, attempt: int, since_seq: int) -> uuid.UUID:
    """The id of the command a reaction sends for ``action`` of a job's attempt, in the state the job
    entered at ``since_seq``: re-running the action after a crash or redelivery sends the same command."""
    return uuid.uuid5(_REACTION_NAMESPACE, f"{job_id}:{action}:{attempt}:{since_seq}")


def pod_ended_command_id(pod_uid: str) -> uuid.UUID:
    """The id of the report that the learner pod ``pod_uid`` ended (exited or lost): one per pod."""
    return uuid.uuid5(_POD_REPORT_NAMESPACE, f"{pod_uid}:ended")


def pod_saved_command_id(pod_uid: str) -> uuid.UUID:
    """The id of the report of the checkpoint the learner of pod ``pod_uid`` saved last, sent with
    the report of its end: one per pod."""
    return uuid.uuid5(_POD_REPORT_NAMESPACE, f"{pod_uid}:saved")
