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
checked again here by the rules a submission's env is checked by (``env_problems``, part of
``JobSpec.submission_problems``) before anything starts: a job submitted under older rules may
still be on the log.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, env_problems
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
    launcher sets; ``worker_addresses`` where each learner's TensorFlow server listens (a job of
    another framework ignores them); ``base`` is what lies under everything (what the learner keeps
    of the launcher process's environment, the learner's home, an image's defaults), overridden by
    the request and the contract, and, for the command only, by the job's env.
    """

    master_addr: str
    master_port: int
    checkpoint_dir: str
    default_result_dir: str
    heartbeats_url: str
    heartbeat_ttl_s: float
    files: Mapping[str, str] = field(default_factory=dict)
    base: Mapping[str, str] = field(default_factory=dict)
    #: Each learner's ``host:port`` by rank, for TensorFlow's ``TF_CONFIG``; empty: no TF_CONFIG.
    worker_addresses: Sequence[str] = ()


def checkpoint_path(uri: str, checkpoint_dir: str) -> str | None:
    """The path a checkpoint ``uri`` (``file:///...``, or an absolute path, which the job's owner
    reads as one too) names when it lies inside ``checkpoint_dir`` (by its words: ``..`` cannot
    climb out), else None. Symbolic links are the caller's to refuse. A bare path was once
    recorded as the job's checkpoint by the owner but handed to no learner: the job restarted
    from nothing, saying it resumed."""
    if "\0" in uri or not (uri.startswith(("file:///", "/"))):
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


#: The ``framework`` names (in any case) that get a ``TF_CONFIG``.
TENSORFLOW_FRAMEWORKS = frozenset({"tensorflow", "tf", "keras"})
#: What a simulated GPU placement exposes instead of CUDA devices (there are none behind it).
SIMULATED_GPU_TYPE = "simulated"


def is_tensorflow(framework: str | None) -> bool:
    return (framework or "").strip().lower() in TENSORFLOW_FRAMEWORKS


def tf_config(worker_addresses: Sequence[str], rank: int) -> str:
    """TensorFlow's ``TF_CONFIG`` for learner ``rank``: every learner a worker of one cluster, as
    ``MultiWorkerMirroredStrategy`` and ``TFConfigClusterResolver`` read it (the first worker is the
    chief, as TensorFlow's own default says)."""
    return json.dumps(
        {"cluster": {"worker": list(worker_addresses)}, "task": {"type": "worker", "index": rank}},
        separators=(",", ":"),
    )


def torch_elastic_environment(
    request: LaunchRequest, learner: LearnerPlacement, site: LearnerSite
) -> dict[str, str]:
    """The names torch elastic (``torchrun``) gives its workers, for a learner as ffdl runs it.

    One learner is one elastic *node* (a worker group under one agent, as each learner is under
    one ffdl agent): ``GROUP_RANK`` = ``NODE_RANK`` = the learner's rank, and the learner's own
    processes are its local workers. ``CUDA_VISIBLE_DEVICES`` holds only the learner's GPUs, so
    ``LOCAL_RANK`` indexes them from 0 and ``torch.cuda.set_device(LOCAL_RANK)`` picks the right one.
    A plain command is the node's only worker (``LOCAL_RANK`` 0, ``LOCAL_WORLD_SIZE`` 1, ``RANK`` =
    the learner's rank). Under ``launcher: torchrun`` the learner's torchrun gets its options as
    its ``PET_*`` variables (torchrun's documented equivalent of its flags: static rendezvous at
    rank 0's address, this learner's node rank, ``nproc_per_node`` workers, no restarts of its own
    since ffdl restarts the gang) and sets ``RANK``, ``LOCAL_RANK`` ... for each worker itself.
    ``TORCHELASTIC_RESTART_COUNT`` is the number of restarts before this attempt.
    """
    spec = request.spec
    workers = spec.workers_per_learner
    learners = len(request.placement.learners)
    world = str(learners * workers)
    environment = {
        "RANK": str(learner.rank),
        "WORLD_SIZE": world,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(workers),
        "GROUP_RANK": str(learner.rank),
        "GROUP_WORLD_SIZE": str(learners),
        "NODE_RANK": str(learner.rank),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(learner.rank),
        "ROLE_WORLD_SIZE": world,
        "MASTER_ADDR": site.master_addr,
        "MASTER_PORT": str(site.master_port),
        "TORCHELASTIC_RUN_ID": request.job_id,
        "TORCHELASTIC_RESTART_COUNT": str(request.attempt - 1),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
    }
    if spec.launcher == "torchrun":
        environment |= {
            "PET_NNODES": str(learners),
            "PET_NODE_RANK": str(learner.rank),
            "PET_NPROC_PER_NODE": str(workers),
            "PET_MASTER_ADDR": site.master_addr,
            "PET_MASTER_PORT": str(site.master_port),
            "PET_RDZV_BACKEND": "static",
            "PET_MAX_RESTARTS": "0",
            "PET_RUN_ID": request.job_id,
        }
    return environment


def local_worker_addresses(host: str, first_port: int, learners: int) -> list[str]:
    """Where the learners of one machine listen for TensorFlow: consecutive ports from the attempt's
    rendezvous port (free when the launch chose it; the ones above it are most likely free too)."""
    return [f"{host}:{first_port + rank}" for rank in range(learners)]


#: The program ``launcher: torchrun`` runs the command under, found on the learner's ``PATH``.
TORCHRUN = "torchrun"


def learner_command(spec: JobSpec) -> str:
    """The shell command a learner's agent runs: the spec's, under ``torchrun`` for ``launcher:
    torchrun`` (a command that names ``torchrun`` itself is taken as it is, so ``torchrun train.py``
    and ``train.py`` mean the same). torchrun reads its options from the ``PET_*`` variables
    :func:`torch_elastic_environment` sets; an option written in the command wins over them."""
    if spec.launcher != "torchrun" or spec.command.split(maxsplit=1)[:1] == [TORCHRUN]:
        return spec.command
    return f"{TORCHRUN} {spec.command}"


def threads_per_worker(cpus: float, workers: int) -> int:
    """``OMP_NUM_THREADS``: the learner's CPUs shared by its workers, at least one thread each."""
    return max(1, math.floor(cpus / workers))


def learner_environment(
    request: LaunchRequest,
    learner: LearnerPlacement,
    visible_gpus: Sequence[int],
    site: LearnerSite,
) -> dict[str, str]:
    """The environment of one learner's agent: the contract over the site's base and the request's,
    with the spec's env wrapped for the command (:func:`command_environment`).

    Precedence, lowest first: ``site.base``, the defaults a job may change (``PYTHONUNBUFFERED=1``,
    so a Python learner's prints reach the log, and count as progress, as they happen;
    ``OMP_NUM_THREADS`` from the learner's ``cpus``), the request's env, and the contract's names
    (:func:`torch_elastic_environment`, ``TF_CONFIG`` for a TensorFlow job, FfDL's), which nothing
    overrides. ``visible_gpus`` are the GPU indices as the learner sees them (on a shared machine
    its placement's indices, in PCI bus order as ``nvidia-smi`` numbers them; in a container that
    holds only its own GPUs, 0..G-1); simulated GPUs
    are no CUDA devices, so their learner sees none (``CUDA_VISIBLE_DEVICES`` empty) and finds its
    share in ``FFDL_SIMULATED_GPUS``. Raises :class:`RefusedEnvironment` for a job env no learner
    may run with.
    """
    _check(request.spec.env)
    spec = request.spec
    learners = str(len(request.placement.learners))
    simulated = learner.gpu_type == SIMULATED_GPU_TYPE
    gpus = ",".join(str(gpu) for gpu in visible_gpus)
    contract = {
        "FFDL_JOB_ID": request.job_id,
        "FFDL_TENANT": request.tenant,
        "FFDL_ATTEMPT": str(request.attempt),
        "FFDL_CHECKPOINT_DIR": site.checkpoint_dir,
        "FFDL_RESUME_FROM": resume_path(request.resume_from, site.checkpoint_dir),
        "FFDL_HEARTBEATS": site.heartbeats_url,
        "FFDL_HEARTBEAT_TTL": str(site.heartbeat_ttl_s),
        "FFDL_KEEP_CHECKPOINTS": str(spec.keep_checkpoints),
        **site.files,
        **torch_elastic_environment(request, learner, site),
        "CUDA_VISIBLE_DEVICES": "" if simulated else gpus,
        "LEARNER_ID": str(learner.rank + 1),
        "NUM_LEARNERS": learners,
        "CHECKPOINT_DIR": site.checkpoint_dir,
        "RESULT_DIR": spec.result_dir or site.default_result_dir,
        "DATA_DIR": spec.data_dir or "",
    }
    if simulated:
        contract["FFDL_SIMULATED_GPUS"] = gpus
    elif gpus:
        # The placement's indices are nvidia-smi's (PCI bus order); CUDA's own default order is
        # fastest first, which would hand a learner another learner's GPU on a mixed machine.
        contract["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if is_tensorflow(spec.framework) and site.worker_addresses:
        contract["TF_CONFIG"] = tf_config(site.worker_addresses, learner.rank)
    defaults = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(threads_per_worker(spec.cpus, spec.workers_per_learner)),
    }
    wrapped = {JOB_ENV_PREFIX + name: value for name, value in spec.env.items()}
    return {**site.base, **defaults, **request.env, **contract, **wrapped}
