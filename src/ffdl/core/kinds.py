"""The aggregate kinds of the platform, jobs and nodes, and the registry that dispatches to them.

Code that handles several kinds (the owner, the readers of the events topic, the projections, the
SRE tools) looks an envelope's kind up here, in :data:`KINDS`, and goes through the kind. A kind
registered here also needs its place in what is written per kind outside the domain: its envelopes
in the codec (the wire), its tables in the projections and its view in the SRE replay.
"""

from __future__ import annotations

from ffdl.core.aggregate import Kinds
from ffdl.core.decider import JOBS, JobKind
from ffdl.core.nodes import NODES
from ffdl.core.places import CheckpointPlaces
from ffdl.core.restart import RestartPolicy

__all__ = ["JOBS", "KINDS", "NODES", "aggregate_kinds"]


def aggregate_kinds(
    policy: RestartPolicy | None = None, checkpoints: CheckpointPlaces | None = None
) -> Kinds:
    """Jobs, decided with the restart ``policy`` (default: the default policy) and the jobs'
    ``checkpoints`` places (default: anywhere), and nodes."""
    if policy is None and checkpoints is None:
        return Kinds(JOBS, NODES)
    return Kinds(JobKind(policy, checkpoints), NODES)


#: Jobs and nodes, with the default restart policy.
KINDS = aggregate_kinds()
