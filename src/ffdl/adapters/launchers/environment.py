"""The learner environment contract of architecture §6, shared by every launcher.

A learner's training code needs no change because it reads everything from its environment: the
``FFDL_*`` names, the names PyTorch's ``env://`` rendezvous reads, ``CUDA_VISIBLE_DEVICES`` and
FfDL's own names. Launchers differ only in *where* things are (a directory on this machine or a
path inside a pod, a loopback rendezvous or a pod's DNS name, which GPU indices the learner sees),
so they describe that in a :class:`LearnerSite` and this module builds the same variables for all.

Two environments, built by the platform, never copied from it: the learner agent's (the site's
base, the request's and the contract's names) and the user's command's, which the agent derives
from its own (:func:`command_environment`). The job's own ``env`` rides in the agent's environment
wrapped (``FFDL_JOB_ENV_<NAME>``), so it cannot change what the agent (platform code, with the
heartbeat store's credentials) loads or runs; only the command gets it unwrapped. The job's env is
checked again here (``JobSpec.submission_problems``) before anything starts: a job submitted under
older rules may still be on the log.

Pure functions, no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ffdl.events.model import Checkpoint, LearnerPlacement, env_problems
from ffdl.handlers.ports import LaunchRequest

#: What a learner keeps of the environment the platform runs in; everything else of it (the
#: platform's settings and credentials: ``FFDL_TOKEN``, ``FFDL_KAFKA__SASL_PASSWORD``...) stays
#: out. ``PATH`` finds programs; the locale and time zone make them behave as the operator set up;
#: ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` are the operator's interpreter and loader paths: the agent
#: is the platform's own code and must import the same ``ffdl``, and training code finds
#: ``ffdl.learner`` and the CUDA libraries the same way (a job itself may not set either).
INHERITED_VARIABLES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH"})
INHERITED_PREFIXES = ("LC_",)
#: The job's env, wrapped for the agent to hand to the command only.
JOB_ENV_PREFIX = "FFDL_JOB_ENV_"
#: ``UID:GID`` the agent runs the command as (local launcher, platform running as root).
RUN_AS_VARIABLE = "FFDL_RUN_AS"
#: The heartbeat store's credentials: for the agent, not for the command.
HEARTBEATS_USERNAME_VARIABLE = "FFDL_HEARTBEATS_USERNAME"
HEARTBEATS_PASSWORD_VARIABLE = "FFDL_HEARTBEATS_PASSWORD"
#: The sandbox the agent starts the command in (bwrap's arguments, JSON; local launcher).
SANDBOX_VARIABLE = "FFDL_SANDBOX"
#: The learner's cgroup limits (JSON; local launcher).
CGROUP_VARIABLE = "FFDL_CGROUP"
#: Where the command runs (the agent itself runs elsewhere: in a directory the learner cannot write).
COMMAND_DIR_VARIABLE = "FFDL_COMMAND_DIR"
#: Where ``ffdl.learner`` sends its reports: the socket the agent listens on, as the command sees it.
REPORT_SOCKET_VARIABLE = "FFDL_REPORT_SOCKET"
#: The socket's name in the agent's working directory, where the agent listens.
REPORT_SOCKET_NAME = "report.sock"
_AGENT_ONLY = frozenset(
    {
        RUN_AS_VARIABLE,
        HEARTBEATS_USERNAME_VARIABLE,
        HEARTBEATS_PASSWORD_VARIABLE,
        SANDBOX_VARIABLE,
        CGROUP_VARIABLE,
        COMMAND_DIR_VARIABLE,
    }
)


class RefusedEnvironment(ValueError):
    """A job's env that no learner may run with (it names what only the platform may set)."""


def inherited_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a learner keeps of ``environ`` (the platform's): :data:`INHERITED_VARIABLES` and the locale."""
    return {
        name: value
        for name, value in environ.items()
        if name in INHERITED_VARIABLES or name.startswith(INHERITED_PREFIXES)
    }


def command_environment(agent_environment: Mapping[str, str]) -> dict[str, str]:
    """The user's command's environment: the agent's, less what is the agent's alone, with the job's
    env unwrapped over it (the job's env may override the base, never a contract name)."""
    job_env = {
        name.removeprefix(JOB_ENV_PREFIX): value
        for name, value in agent_environment.items()
        if name.startswith(JOB_ENV_PREFIX)
    }
    _check(job_env)
    own = {
        name: value
        for name, value in agent_environment.items()
        if name not in _AGENT_ONLY and not name.startswith(JOB_ENV_PREFIX)
    }
    return {**own, **job_env}


def _check(job_env: Mapping[str, str]) -> None:
    if problems := env_problems(job_env):
        raise RefusedEnvironment("; ".join(f"{field}: {message}" for field, message in problems))


@dataclass(frozen=True, slots=True)
class LearnerSite:
    """Where a launcher runs the learners of one attempt, in the learners' own terms.

    ``files`` holds the agent's file and socket names (``FFDL_LOG_FILE``, ``FFDL_REPORT_SOCKET``) a
    launcher sets; ``base`` is what lies under everything (what the learner keeps of the launcher process's
    environment, the learner's home, an image's defaults), overridden by the request and the
    contract, and, for the command only, by the job's env.
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


def checkpoint_path(uri: str, checkpoint_dir: str) -> str | None:
    """The path a ``file://`` checkpoint ``uri`` names when it lies inside ``checkpoint_dir`` (by its
    words: ``..`` cannot climb out), else None. Symbolic links are the caller's to refuse."""
    if not uri.startswith("file:///") or "\0" in uri:
        return None
    path = posixpath.normpath(uri.removeprefix("file://"))
    root = posixpath.normpath(checkpoint_dir)
    if not posixpath.isabs(root) or path == root or not path.startswith(root.rstrip("/") + "/"):
        return None
    return path


def resume_path(checkpoint: Checkpoint | None, checkpoint_dir: str) -> str:
    """``FFDL_RESUME_FROM``: the checkpoint to resume from as a path inside ``checkpoint_dir``, or ""
    (a fresh start, or a checkpoint recorded outside it, which no learner is handed)."""
    if checkpoint is None:
        return ""
    return checkpoint_path(checkpoint.uri, checkpoint_dir) or ""


def learner_environment(
    request: LaunchRequest,
    learner: LearnerPlacement,
    local_rank: int,
    visible_gpus: Sequence[int],
    site: LearnerSite,
) -> dict[str, str]:
    """The environment of one learner's agent: the contract over the site's base and the request's,
    with the spec's env wrapped for the command (:func:`command_environment`).

    Precedence, lowest first: ``site.base``, ``PYTHONUNBUFFERED=1`` (so a Python learner's prints
    reach the log, and count as progress, as they happen), the request's env, and the contract's
    names, which nothing overrides. ``visible_gpus`` are the GPU indices as the learner sees them
    (on a shared machine its placement's indices; in a container that holds only its own GPUs,
    0..G-1). Raises :class:`RefusedEnvironment` for a job env no learner may run with.
    """
    _check(request.spec.env)
    learners = str(len(request.placement.learners))
    contract = {
        "FFDL_JOB_ID": request.job_id,
        "FFDL_TENANT": request.tenant,
        "FFDL_ATTEMPT": str(request.attempt),
        "FFDL_CHECKPOINT_DIR": site.checkpoint_dir,
        "FFDL_RESUME_FROM": resume_path(request.resume_from, site.checkpoint_dir),
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
    wrapped = {JOB_ENV_PREFIX + name: value for name, value in request.spec.env.items()}
    return {**site.base, "PYTHONUNBUFFERED": "1", **request.env, **contract, **wrapped}
