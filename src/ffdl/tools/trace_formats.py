"""The public GPU-cluster traces as ``ffdl simulate`` workloads, each format found by its shape.

:func:`load_trace` reads a path and tells the formats apart by what they hold, not by the file's
name: a JSON array is Philly's ``cluster_job_log``; a CSV by its header (Philly-derived job table,
Helios ``cluster_log.csv``, Alibaba 2023 ``openb_pod_list``) or, for the Alibaba PAI 2020 tables,
which are published without a header, by their column count; anything else is ffdl's own JSON
Lines (:func:`ffdl.tools.traces.read_trace`). The PAI trace is two tables: give the directory
holding ``pai_job_table.csv`` and ``pai_task_table.csv``, or the task table with the job table
beside it.

The mapping (docs/scheduling.md, "Trace formats", says the same with the reasons):

* A job's GPUs become a gang of learners of equal size: whole nodes for a job bigger than a node,
  else one learner (:func:`gang_shape`); a size that does not divide into nodes gets the largest
  learner size that divides it (12 GPUs on 8-GPU nodes: 2 x 6). A fractional GPU (PAI, openb)
  takes a whole one: ffdl does not share GPUs.
* The tenant is the virtual cluster where the trace has one (Philly, Helios), else the user
  (PAI), else the pod's QoS class (openb, which names no user).
* The runtime is how long the job held its GPUs; failed and killed jobs are kept for as long as
  they ran (they held the GPUs that long), jobs that never ran or never ended in the trace, and
  jobs without GPUs, are left out. Times become seconds since the epoch (UTC).
* GPU types are dropped: the simulated cluster has one type.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ffdl.core.simulation import TraceJob
from ffdl.tools.traces import TraceError, read_trace

PHILLY_CSV = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
HELIOS = ("job_id", "user", "vc", "gpu_num", "node_num", "state", "submit_time", "start_time", "end_time")
OPENB = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")
#: The PAI 2020 tables' columns, in order (the published CSVs have no header).
PAI_JOB = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)
#: openb's QoS classes as priorities: latency-sensitive first, best effort last.
OPENB_PRIORITY = {"LS": 10, "Guaranteed": 10, "Burstable": 0, "BE": -10}


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(learners, GPUs per learner) for a job of ``gpus`` GPUs on nodes of ``gpus_per_node``: one
    learner if it fits a node, else the largest learner size up to a node that divides it."""
    if gpus <= gpus_per_node:
        return 1, gpus
    per = next(size for size in range(gpus_per_node, 0, -1) if gpus % size == 0)
    return gpus // per, per


def load_trace(path: Path, gpus_per_node: int = 8) -> list[TraceJob]:
    """The jobs of the trace at ``path`` in whichever format it is (see the module docstring); a
    trace that is not what its format says raises :class:`TraceError` naming the file, never a
    Python error from deep inside (a field of the wrong type, bytes that are not UTF-8)."""
    try:
        return _load(path, gpus_per_node)
    except (UnicodeDecodeError, TypeError, AttributeError, OverflowError, RecursionError, KeyError) as exc:
        raise TraceError(f"{path}: not a trace of the format it looks like: {exc}") from exc


def _load(path: Path, gpus_per_node: int) -> list[TraceJob]:
    if path.is_dir():
        return _pai(path / "pai_job_table.csv", path / "pai_task_table.csv", gpus_per_node)
    with path.open(newline="") as handle:
        start = handle.read(4096)
    stripped = start.lstrip()
    if stripped.startswith("["):
        return _philly_json(path, gpus_per_node)
    if stripped.startswith("{"):
        return read_trace(path)
    header = tuple(cell.strip() for cell in next(csv.reader([start.splitlines()[0] if start else ""]), []))
    if header == PHILLY_CSV:
        return _philly_csv(path, gpus_per_node)
    if set(HELIOS) <= set(header):
        return _helios(path, gpus_per_node)
    if set(OPENB) <= set(header):
        return _openb(path, gpus_per_node)
    if len(header) == len(PAI_TASK) or header[:3] == PAI_TASK[:3]:
        return _pai(path.with_name("pai_job_table.csv"), path, gpus_per_node)
    if len(header) == len(PAI_JOB) or header[:3] == PAI_JOB[:3]:
        return _pai(path, path.with_name("pai_task_table.csv"), gpus_per_node)
    return read_trace(path)


def _rows(path: Path, columns: Sequence[str] | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    """Each row as a dict, with its line number; ``columns`` for a CSV without a header (a header
    row, if there is one after all, is skipped)."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle, fieldnames=list(columns) if columns else None)
        for number, row in enumerate(reader, start=1 if columns else 2):
            if columns and number == 1 and row.get(columns[0]) == columns[0]:
                continue
            yield number, {key: (value or "").strip() for key, value in row.items() if key is not None}


def _number(path: Path, line: int, row: dict[str, str], column: str) -> float:
    try:
        value = float(row[column])
    except (KeyError, ValueError) as exc:
        raise TraceError(f"{path}:{line}: {column}: not a number: {row.get(column)!r}") from exc
    if not math.isfinite(value):
        raise TraceError(f"{path}:{line}: {column}: not a finite number: {row.get(column)!r}")
    return value


def _optional(row: dict[str, str], column: str) -> float | None:
    """A number that a trace may leave empty (NaN, None or blank for a job that never got there)."""
    try:
        value = float(row.get(column) or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _when(path: Path, line: int, text: str | None, column: str) -> float:
    """A timestamp as seconds since the epoch: ``YYYY-MM-DD HH:MM:SS`` (UTC) or a number."""
    if not text or text == "None":
        raise TraceError(f"{path}:{line}: {column}: no time")
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # NaN never equals the clock: the simulator waited for ever
            raise TraceError(f"{path}:{line}: {column}: not a time: {text!r}")
        return seconds
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise TraceError(f"{path}:{line}: {column}: not a time: {text!r}") from exc


def _job(
    job_id: str, submit: float, tenant: str, gpus: int, runtime: float, gpus_per_node: int, priority: int = 0
) -> TraceJob:
    learners, per = gang_shape(gpus, gpus_per_node)
    return TraceJob(job_id, submit, tenant or "default", learners, per, max(runtime, 1.0), priority)


def _philly_csv(path: Path, gpus_per_node: int) -> list[TraceJob]:
    """The Philly-derived job table (shared/traces/README.md): tenant = ``cluster``."""
    jobs = []
    for line, row in _rows(path):
        gpus = int(_number(path, line, row, "num_gpus"))
        runtime = _number(path, line, row, "duration")
        if gpus <= 0 or runtime <= 0:
            continue
        submit = _when(path, line, row["timestamp"], "timestamp")
        jobs.append(_job(f"philly-{line}", submit, row["cluster"], gpus, runtime, gpus_per_node))
    return jobs


def _philly_json(path: Path, gpus_per_node: int) -> list[TraceJob]:
    """Philly's ``cluster_job_log``: the GPUs of the job's last attempt (the machines it ran on and
    the GPUs on each), the runtime the sum of its attempts (each attempt ran from the start again)."""
    try:
        records: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a cluster_job_log JSON array: {exc}") from exc
    if not isinstance(records, list):
        raise TraceError(f"{path}: not a cluster_job_log JSON array")
    jobs = []
    for index, record in enumerate(records, start=1):
        where = f"{path}: job {index}"
        if not isinstance(record, dict):
            raise TraceError(f"{where}: not an object")
        runtime = 0.0
        gpus = 0
        for attempt in record.get("attempts") or []:
            start, end = attempt.get("start_time"), attempt.get("end_time")
            if not start or not end:
                continue  # an attempt that never started, or never ended in the trace
            runtime += _when(path, index, end, "end_time") - _when(path, index, start, "start_time")
            gpus = sum(len(machine.get("gpus") or []) for machine in attempt.get("detail") or [])
        if gpus <= 0 or runtime <= 0:
            continue
        submit = _when(path, index, record.get("submitted_time"), "submitted_time")
        job_id = str(record.get("jobid") or f"philly-{index}")
        jobs.append(_job(job_id, submit, str(record.get("vc") or ""), gpus, runtime, gpus_per_node))
    return jobs


def _helios(path: Path, gpus_per_node: int) -> list[TraceJob]:
    """Helios ``cluster_log.csv``: tenant = ``vc``, learners = ``node_num`` when the GPUs divide
    evenly over the nodes, runtime = end - start."""
    jobs = []
    for line, row in _rows(path):
        gpus = int(_optional(row, "gpu_num") or 0)
        if gpus <= 0 or not row.get("start_time") or not row.get("end_time"):
            continue  # a CPU job, or one that never ran or never ended in the trace
        start = _when(path, line, row["start_time"], "start_time")
        end = _when(path, line, row["end_time"], "end_time")
        submit = _when(path, line, row["submit_time"], "submit_time")
        nodes = int(_optional(row, "node_num") or 1)
        per_node = gpus // nodes if nodes > 0 and gpus % nodes == 0 else 0
        if nodes > 1 and 0 < per_node <= gpus_per_node:
            job = TraceJob(
                row["job_id"], submit, row["vc"] or "default", nodes, per_node, max(end - start, 1.0)
            )
        else:
            job = _job(row["job_id"], submit, row["vc"], gpus, end - start, gpus_per_node)
        if end > start:
            jobs.append(job)
    return jobs


def _openb(path: Path, gpus_per_node: int) -> list[TraceJob]:
    """Alibaba 2023 ``openb_pod_list``: one pod a job; ``num_gpu`` GPUs (a pod with a share of
    one, ``gpu_milli`` under 1000, takes a whole GPU); tenant and priority from ``qos``; runtime
    from scheduling to deletion."""
    jobs = []
    for line, row in _rows(path):
        gpus = int(_optional(row, "num_gpu") or 0)
        scheduled, deleted = _optional(row, "scheduled_time"), _optional(row, "deletion_time")
        if gpus <= 0 or scheduled is None or deleted is None or deleted <= scheduled:
            continue
        submit = _number(path, line, row, "creation_time")
        qos = row["qos"] or "default"
        jobs.append(
            _job(
                row["name"], submit, qos, gpus, deleted - scheduled, gpus_per_node, OPENB_PRIORITY.get(qos, 0)
            )
        )
    return jobs


def _pai(job_table: Path, task_table: Path, gpus_per_node: int) -> list[TraceJob]:
    """Alibaba PAI 2020: the job table gives the tenant (``user``) and the submission time; the
    job's tasks give its GPUs (the instances of every task that plans GPUs, each taking
    ``plan_gpu`` / 100 GPUs rounded up) and its runtime (first task start to last task end)."""
    users: dict[str, tuple[str, float | None]] = {}
    for _, row in _rows(job_table, PAI_JOB):
        users[row["job_name"]] = (row["user"], _optional(row, "start_time"))
    learners: dict[str, int] = {}
    per_learner: dict[str, int] = {}
    spans: dict[str, tuple[float, float]] = {}
    for line, row in _rows(task_table, PAI_TASK):
        plan = _optional(row, "plan_gpu") or 0.0
        count = int(_optional(row, "inst_num") or 0)
        start, end = _optional(row, "start_time"), _optional(row, "end_time")
        if plan <= 0 or count <= 0 or start is None or end is None or end <= start:
            continue
        name = row["job_name"]
        if name not in users:
            raise TraceError(f"{task_table}:{line}: job {name!r} is not in {job_table.name}")
        learners[name] = learners.get(name, 0) + count
        per_learner[name] = max(per_learner.get(name, 0), math.ceil(plan / 100))
        low, high = spans.get(name, (start, end))
        spans[name] = (min(low, start), max(high, end))
    jobs = []
    for name, (low, high) in spans.items():
        user, submitted = users[name]
        per = per_learner[name]
        count = learners[name]
        submit = submitted if submitted is not None else low
        if per > gpus_per_node:
            jobs.append(_job(name, submit, user, count * per, high - low, gpus_per_node))
        else:
            jobs.append(TraceJob(name, submit, user or "default", count, per, max(high - low, 1.0)))
    return jobs
