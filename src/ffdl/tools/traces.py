"""Workload traces for ``ffdl simulate``: the JSON Lines format, the public GPU-cluster traces
(read by :mod:`ffdl.tools.trace_formats`), and a seeded generator of traces shaped like
Microsoft's Philly cluster.

A trace is one job a line: ``{"submit_time": s, "tenant": str, "learners": int,
"gpus_per_learner": int, "runtime": s, "priority": int}``, optionally ``"gpu_type"`` and
``"job_id"`` (default: ``job-<line number>``).

The generator follows the shapes published for Philly (Jeon et al., "Analysis of Large-Scale
Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC 2019): most jobs ask for 1 to 8
GPUs (single-GPU jobs the majority), with a tail of 16 to 128; runtimes are heavy-tailed (a
log-normal with a median of a quarter hour and a tail to days, longer for bigger jobs); jobs come
from several tenants ("virtual clusters") of very unequal size. Arrivals are a Poisson process
whose rate is set so the trace offers ``load`` times the capacity of the cluster it is meant for.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ffdl.core.simulation import TraceJob

#: Total GPUs per job and how often each occurs.
GPU_SHAPES: tuple[tuple[int, float], ...] = (
    (1, 0.55),
    (2, 0.10),
    (4, 0.13),
    (8, 0.14),
    (16, 0.04),
    (32, 0.025),
    (64, 0.01),
    (128, 0.005),
)
#: Priority classes and how often each occurs: most jobs normal, some production, some best effort.
PRIORITIES: tuple[tuple[int, float], ...] = ((0, 0.8), (10, 0.1), (-10, 0.1))
MEDIAN_RUNTIME_S = 900.0
RUNTIME_SIGMA = 1.6
MIN_RUNTIME_S = 30.0
MAX_RUNTIME_S = 7 * 86_400.0


#: The latest submission and the longest runtime a trace may give, in seconds (about the year 5138,
#: and 31 years): a runtime of 1e300 s overflowed the figures into a traceback.
LATEST_SUBMIT_S = 1e11
LONGEST_RUNTIME_S = 1e9


class TraceError(ValueError):
    """A trace line that is not a job; the message names the line."""


class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    submit_time: Annotated[float, Field(ge=0)]
    tenant: Annotated[str, Field(min_length=1, max_length=63)]
    learners: Annotated[int, Field(ge=1, le=1024)]
    gpus_per_learner: Annotated[int, Field(ge=0, le=16)]
    runtime: Annotated[float, Field(gt=0)]
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    gpu_type: str | None = None
    job_id: Annotated[str | None, Field(min_length=1, max_length=128)] = None


def read_trace(path: Path) -> list[TraceJob]:
    """The jobs of a JSON Lines trace (:func:`checked_jobs`)."""
    return checked_jobs((f"{path}:{line}", job) for line, job in located_trace(path))


def located_trace(path: Path) -> list[tuple[int, TraceJob]]:
    """The jobs of a JSON Lines trace, each with its line, not checked against each other yet."""
    jobs = []
    with path.open(encoding="utf-8-sig") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                raw = _TraceLine.model_validate_json(line)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"]) or "(line)"
                raise TraceError(f"{path}:{number}: {where}: {error['msg']}") from exc
            job = TraceJob(
                job_id=raw.job_id or f"job-{number}",
                submit_time=raw.submit_time,
                tenant=raw.tenant,
                learners=raw.learners,
                gpus_per_learner=raw.gpus_per_learner,
                runtime=raw.runtime,
                priority=raw.priority,
                gpu_type=raw.gpu_type,
            )
            jobs.append((number, job))
    return jobs


def checked_jobs(located: Iterable[tuple[str, TraceJob]]) -> list[TraceJob]:
    """The jobs of a trace, each given with where it came from, checked: each has an id of its own
    (the simulator keeps its books by id: two jobs of one id became one, and the other's outcome
    was lost without a word), is submitted between 0 and :data:`LATEST_SUBMIT_S` and runs at most
    :data:`LONGEST_RUNTIME_S`; else :class:`TraceError` naming where."""
    seen: dict[str, str] = {}
    jobs = []
    for where, job in located:
        if job.job_id in seen:
            raise TraceError(
                f"{where}: job id {job.job_id!r} again (first at {seen[job.job_id]}): "
                "each job needs an id of its own"
            )
        seen[job.job_id] = where
        if not 0 <= job.submit_time <= LATEST_SUBMIT_S:
            raise TraceError(
                f"{where}: submitted at {job.submit_time:g} s since the epoch; the simulator takes 0 to "
                f"{LATEST_SUBMIT_S:g}"
            )
        if job.runtime > LONGEST_RUNTIME_S:
            raise TraceError(
                f"{where}: runs {job.runtime:g} s; the simulator takes up to {LONGEST_RUNTIME_S:g}"
            )
        jobs.append(job)
    return jobs


def write_trace(jobs: Iterable[TraceJob], path: Path) -> int:
    count = 0
    with path.open("w") as out:
        for job in jobs:
            line = {
                "job_id": job.job_id,
                "submit_time": round(job.submit_time, 3),
                "tenant": job.tenant,
                "learners": job.learners,
                "gpus_per_learner": job.gpus_per_learner,
                "runtime": round(job.runtime, 3),
                "priority": job.priority,
            }
            if job.gpu_type is not None:
                line["gpu_type"] = job.gpu_type
            out.write(json.dumps(line) + "\n")
            count += 1
    return count


def _pick(rng: random.Random, table: tuple[tuple[int, float], ...]) -> int:
    values, weights = zip(*table, strict=True)
    return int(rng.choices(values, weights)[0])


def _shape(rng: random.Random, gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(learners, GPUs per learner) for a job of ``gpus`` GPUs: whole nodes for big jobs; a small
    job is one multi-GPU learner three times in four, else one learner per GPU."""
    if gpus > gpus_per_node:
        return math.ceil(gpus / gpus_per_node), gpus_per_node
    if gpus > 1 and rng.random() < 0.25:
        return gpus, 1
    return 1, gpus


def _runtime(rng: random.Random, gpus: int) -> float:
    median = MEDIAN_RUNTIME_S * (1 + math.log2(gpus) / 3)
    return min(MAX_RUNTIME_S, max(MIN_RUNTIME_S, rng.lognormvariate(math.log(median), RUNTIME_SIGMA)))


def generate_trace(
    jobs: int,
    *,
    nodes: int = 1000,
    gpus_per_node: int = 8,
    load: float = 0.9,
    tenants: int = 6,
    seed: int = 0,
    largest_job: int | None = None,
) -> list[TraceJob]:
    """``jobs`` Philly-shaped jobs offering ``load`` x the capacity of ``nodes`` x ``gpus_per_node``.

    Job sizes scale to the cluster: none is bigger than ``largest_job`` GPUs, by default a quarter
    of the cluster (at least one node), and the sizes above it are left out of the draw rather
    than cut down to it (cut, a small cluster would get many jobs as wide as itself, each of which
    needs the whole cluster). Philly's own jobs reach 128 GPUs on clusters of thousands."""
    rng = random.Random(seed)
    names = [f"vc{index + 1}" for index in range(tenants)]
    shares = [1 / (index + 1) ** 0.9 for index in range(tenants)]
    capacity = nodes * gpus_per_node
    largest = min(capacity, largest_job or max(capacity // 4, gpus_per_node))
    shapes = tuple((gpus, weight) for gpus, weight in GPU_SHAPES if gpus <= largest) or ((largest, 1.0),)
    drawn = []
    for _ in range(jobs):
        gpus = _pick(rng, shapes)
        learners, per_learner = _shape(rng, gpus, gpus_per_node)
        drawn.append(
            (
                learners,
                per_learner,
                _runtime(rng, gpus),
                rng.choices(names, shares)[0],
                _pick(rng, PRIORITIES),
            )
        )
    work = sum(learners * per_learner * runtime for learners, per_learner, runtime, _, _ in drawn)
    rate = load * capacity * jobs / work if work else 1.0
    trace = []
    now = 0.0
    for index, (learners, per_learner, runtime, tenant, priority) in enumerate(drawn):
        now += rng.expovariate(rate)
        trace.append(TraceJob(f"job-{index + 1}", now, tenant, learners, per_learner, runtime, priority))
    return trace
