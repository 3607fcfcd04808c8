"""The learner environment contract of DESIGN §6, shared by every launcher.

A learner's training code needs no change because it reads everything from its environment: the
``FFDL_*`` names, the names PyTorch's ``env://`` rendezvous reads, ``CUDA_VISIBLE_DEVICES`` and
FfDL's own names. Launchers differ only in *where* things are (a directory on this machine or a
path inside a pod, a loopback rendezvous or a pod's DNS name, which GPU indices the learner sees),
so they describe that in a :class:`LearnerSite` and this module builds the same variables for all.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ffdl.events.model import Checkpoint, LearnerPlacement
from ffdl.handlers.ports import LaunchRequest


@dataclass(frozen=True, slots=True)
class LearnerSite:
    """Where a launcher runs the learners of one attempt, in the learners' own terms.

    ``files`` holds the agent's file names (``FFDL_LOG_FILE``, ``FFDL_REPORT_FILE``) a launcher
    sets; ``base`` is what lies under everything (the launcher process's environment, an image's
    defaults), overridden by the spec, the request and the contract in that order.
    """

    master_addr: str
    master_port: int
    checkpoint_dir: str
    default_result_dir: str
    heartbeats_url: str
    heartbeat_ttl_s: float
    files: Mapping[str, str] = field(default_factory=dict)
    base: Mapping[str, str] = field(default_factory=dict)


def local_ranks(learners: Iterable[LearnerPlacement]) -> list[tuple[LearnerPlacement, int]]:
    """Each learner with its index among the job's learners on the same node, in rank order."""
    on_node: dict[str, int] = {}
    ranked = []
    for learner in sorted(learners, key=lambda placed: placed.rank):
        local_rank = on_node.get(learner.node, 0)
        on_node[learner.node] = local_rank + 1
        ranked.append((learner, local_rank))
    return ranked


def resume_path(checkpoint: Checkpoint | None) -> str:
    """``FFDL_RESUME_FROM``: the checkpoint to resume from as a path (``file://`` dropped), or ""."""
    return checkpoint.uri.removeprefix("file://") if checkpoint else ""


def learner_environment(
    request: LaunchRequest,
    learner: LearnerPlacement,
    local_rank: int,
    visible_gpus: Sequence[int],
    site: LearnerSite,
) -> dict[str, str]:
    """The environment of one learner: the contract over the site's base, the spec's and the request's.

    Precedence, lowest first: ``site.base``, ``PYTHONUNBUFFERED=1`` (so a Python learner's prints
    reach the log, and count as progress, as they happen), the spec's env, the request's env, and
    the contract's names, which nothing overrides. ``visible_gpus`` are the GPU indices as the
    learner sees them (on a shared machine its placement's indices; in a container that holds only
    its own GPUs, 0..G-1).
    """
    learners = str(len(request.placement.learners))
    contract = {
        "FFDL_JOB_ID": request.job_id,
        "FFDL_TENANT": request.tenant,
        "FFDL_ATTEMPT": str(request.attempt),
        "FFDL_CHECKPOINT_DIR": site.checkpoint_dir,
        "FFDL_RESUME_FROM": resume_path(request.resume_from),
        "FFDL_HEARTBEATS": site.heartbeats_url,
        "FFDL_HEARTBEAT_TTL": str(site.heartbeat_ttl_s),
        **site.files,
        "RANK": str(learner.rank),
        "WORLD_SIZE": learners,
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": site.master_addr,
        "MASTER_PORT": str(site.master_port),
        "CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in visible_gpus),
        "LEARNER_ID": str(learner.rank + 1),
        "NUM_LEARNERS": learners,
        "CHECKPOINT_DIR": site.checkpoint_dir,
        "RESULT_DIR": request.spec.result_dir or site.default_result_dir,
        "DATA_DIR": request.spec.data_dir or "",
    }
    return {**site.base, "PYTHONUNBUFFERED": "1", **request.spec.env, **request.env, **contract}
