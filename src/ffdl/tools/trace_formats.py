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
  they ran (they held the GPUs that long); jobs that never ran or never ended in the trace, ran no
  time, end before they start, or have no GPUs are left out, and counted by reason
  (:class:`LoadedTrace`). Times become seconds since the epoch (UTC; a time that names its offset
  is converted). A value that cannot be read (a number that is not one, a row of the wrong number
  of fields) is an error naming the line, and so are two jobs of one id.
* GPU types are dropped: the simulated cluster has one type.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ffdl.core.simulation import TraceJob
from ffdl.tools.log_files import parse_time
from ffdl.tools.traces import TraceError, checked_jobs, located_trace

#: The columns each CSV format is known by: those its reader uses (any others may be there too).
PHILLY_CSV = ("timestamp", "duration", "num_gpus", "cluster")
HELIOS = ("job_id", "vc", "gpu_num", "node_num", "submit_time", "start_time", "end_time")
OPENB = ("name", "num_gpu", "qos", "creation_time", "deletion_time", "scheduled_time")
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
#: What a trace may write for a value it does not have (pandas writes NaN and NaT, Slurm Unknown).
MISSING = frozenset({"", "none", "null", "nan", "nat", "unknown"})

# Why a job of a trace is left out (LoadedTrace.left_out counts them).
NO_GPUS = "no GPUs"
NEVER_STARTED = "never started"
NEVER_ENDED = "never ended in the trace"
RAN_NO_TIME = "ran no time"
ENDS_BEFORE_START = "ends before it starts"
NO_SUBMISSION = "no submission time"


@dataclass(slots=True)
class LoadedTrace:
    """A trace's jobs, and why jobs of it were left out with how many for each reason: a trace is
    never cut without a word (``ffdl simulate`` prints them, and its JSON carries them)."""

    jobs: list[TraceJob]
    left_out: dict[str, int] = field(default_factory=dict)


class _Reading:
    """What a format's reader gathers: each job with where it came from, and what it left out."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, TraceJob]] = []
        self.left_out: Counter[str] = Counter()

    def add(self, where: str, job: TraceJob) -> None:
        self.jobs.append((where, job))

    def leave_out(self, reason: str) -> None:
        self.left_out[reason] += 1


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(learners, GPUs per learner) for a job of ``gpus`` GPUs on nodes of ``gpus_per_node``: one
    learner if it fits a node, else the largest learner size up to a node that divides it."""
    if gpus <= gpus_per_node:
        return 1, gpus
    per = next(size for size in range(gpus_per_node, 0, -1) if gpus % size == 0)
    return gpus // per, per


def load_trace(path: Path, gpus_per_node: int = 8) -> LoadedTrace:
    """The jobs of the trace at ``path`` in whichever format it is (see the module docstring), and
    what was left out. A trace that is not what its format says, a value that cannot be read, two
    jobs of one id, a time the simulator cannot use, or no job at all raise :class:`TraceError`
    naming the file and the line, never a Python error from deep inside (a field of the wrong
    type, bytes that are not UTF-8)."""
    try:
        reading = _load(path, gpus_per_node)
    except (UnicodeDecodeError, TypeError, AttributeError, OverflowError, RecursionError, KeyError) as exc:
        raise TraceError(f"{path}: not a trace of the format it looks like: {exc}") from exc
    jobs = checked_jobs(reading.jobs)
    left_out = dict(sorted(reading.left_out.items()))
    if not jobs:
        why = f"; left out: {describe_left_out(left_out)}" if left_out else ""
        raise TraceError(f"{path}: no job to simulate{why}")
    return LoadedTrace(jobs, left_out)


def describe_left_out(left_out: dict[str, int]) -> str:
    """``3 never ended in the trace, 1 no GPUs``: the jobs left out, by reason."""
    return ", ".join(f"{count} {reason}" for reason, count in left_out.items())


def _load(path: Path, gpus_per_node: int) -> _Reading:
    if path.is_dir():
        return _pai(path / "pai_job_table.csv", path / "pai_task_table.csv", gpus_per_node)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        start = handle.read(4096)
    stripped = start.lstrip()
    if stripped.startswith("["):
        return _philly_json(path, gpus_per_node)
    if stripped.startswith("{"):
        return _jsonl(path)
    try:  # the row _rows takes as the header, however many blank rows come before it
        with path.open(encoding="utf-8-sig", newline="") as handle:
            first = next(_filled(csv.reader(handle)), [])
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV ffdl can read: {exc}") from exc
    header = {_column(cell) for cell in first}
    if set(PHILLY_CSV) <= header:
        return _philly_csv(path, gpus_per_node)
    if set(HELIOS) <= header:
        return _helios(path, gpus_per_node)
    if set(OPENB) <= header:
        return _openb(path, gpus_per_node)
    if _pai_table(first, PAI_TASK):
        return _pai(path.with_name("pai_job_table.csv"), path, gpus_per_node)
    if _pai_table(first, PAI_JOB):
        return _pai(path, path.with_name("pai_task_table.csv"), gpus_per_node)
    raise TraceError(
        f"{path}: not a trace ffdl reads: JSON Lines, Philly's cluster_job_log (a JSON array), or a "
        f"CSV with the columns of the Philly-derived table ({','.join(PHILLY_CSV)}), Helios' "
        f"cluster_log.csv or openb's pod list, or a PAI 2020 table (docs/scheduling.md, "
        '"Trace formats")'
    )


def _column(name: str) -> str:
    """A header cell as the formats name their columns (spaces and capitals aside)."""
    return name.strip().lower()


def _pai_table(first: Sequence[str], columns: Sequence[str]) -> bool:
    """Whether a CSV whose first row is ``first`` is the PAI table of ``columns``: those columns as
    its header, or (as published, without one) as many fields with times where the times are."""
    if [_column(cell) for cell in first] == list(columns):
        return True
    if len(first) != len(columns):
        return False
    times = (first[columns.index("start_time")], first[columns.index("end_time")])
    return all(_is_number(cell) or cell.strip().lower() in MISSING for cell in times)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _jsonl(path: Path) -> _Reading:
    reading = _Reading()
    for line, job in located_trace(path):
        reading.add(f"{path}:{line}", job)
    return reading


def _rows(path: Path, columns: Sequence[str] | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    """Each row as a dict by column name, with the line it ends on; ``columns`` for a CSV without a
    header (a header row, if there is one after all, is skipped). Blank rows are skipped
    (:func:`_filled`); a row of another number of fields than the header (a line cut short, a
    comma too many) is an error, and so is a header naming a column twice (which of the two holds
    its values cannot be told: the last was read, silently); a cell with no name (a trailing
    comma) names no column, and may come more than once."""
    try:
        handle = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            rows = _filled(reader)
            header = list(columns) if columns else [_column(cell) for cell in next(rows, [])]
            twice = [name for name, count in Counter(header).items() if name and count > 1]
            if twice:
                raise TraceError(
                    f"{path}:{reader.line_num}: the header names the column {twice[0]!r} twice: which "
                    "of the two holds its values cannot be told"
                )
            for index, cells in enumerate(rows):
                line = reader.line_num
                if columns and index == 0 and [_column(cell) for cell in cells] == header:
                    continue
                if len(cells) != len(header):
                    raise TraceError(f"{path}:{line}: {len(cells)} fields, where the table has {len(header)}")
                yield line, {name: cell.strip() for name, cell in zip(header, cells, strict=True)}
        except csv.Error as exc:  # a field over the csv module's limit, a quote left open at the end
            raise TraceError(f"{path}:{reader.line_num}: not a CSV ffdl can read: {exc}") from exc


def _filled(rows: Iterable[list[str]]) -> Iterator[list[str]]:
    """The rows of a CSV that are not blank: a blank line or a row of nothing but empty fields
    (``,,,,``, as a spreadsheet exports) is skipped wherever it stands, before the header too. One
    rule for telling the format from its header (:func:`_load`) and for reading it (:func:`_rows`),
    so a file is never read with a header other than the one it was told apart by."""
    return (cells for cells in rows if any(cell.strip() for cell in cells))


def _number(where: str, row: dict[str, str], column: str) -> float:
    try:
        value = float(row[column])
    except (KeyError, ValueError) as exc:
        raise TraceError(f"{where}: {column}: not a number: {row.get(column)!r}") from exc
    if not math.isfinite(value):
        raise TraceError(f"{where}: {column}: not a finite number: {row.get(column)!r}")
    return value


def _optional(where: str, row: dict[str, str], column: str) -> float | None:
    """A number a trace may leave out (blank, None or NaN: a job that never got there); None then.
    Anything else that is not a number is an error, not a job that never got there."""
    if row.get(column, "").lower() in MISSING:
        return None
    return _number(where, row, column)


def _count(where: str, row: dict[str, str], column: str) -> int | None:
    """A count (GPUs, nodes, instances) a trace may leave out; a count that is not whole is an error."""
    value = _optional(where, row, column)
    if value is None:
        return None
    if not value.is_integer():
        raise TraceError(f"{where}: {column}: not a whole number: {row[column]!r}")
    return int(value)


def _moment(where: str, value: object, column: str) -> float | None:
    """A time as seconds since the epoch, from ``YYYY-MM-DD HH:MM:SS`` (UTC unless it says its
    offset) or a number of seconds; None where the trace has none (blank, None, null)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in MISSING):
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TraceError(f"{where}: {column}: not a time: {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # NaN never equals the clock: the simulator waited for ever
            raise TraceError(f"{where}: {column}: not a time: {value!r}")
        return seconds
    try:
        return parse_time(str(value).strip()).timestamp()
    except ValueError as exc:
        raise TraceError(f"{where}: {column}: not a time: {value!r}") from exc


def _when(where: str, value: object, column: str) -> float:
    """A time the trace must give (:func:`_moment`)."""
    moment = _moment(where, value, column)
    if moment is None:
        raise TraceError(f"{where}: {column}: not a time: {value!r}")
    return moment


def _job(
    job_id: str, submit: float, tenant: str, gpus: int, runtime: float, gpus_per_node: int, priority: int = 0
) -> TraceJob:
    learners, per = gang_shape(gpus, gpus_per_node)
    return TraceJob(job_id, submit, tenant or "default", learners, per, max(runtime, 1.0), priority)


def _philly_csv(path: Path, gpus_per_node: int) -> _Reading:
    """The Philly-derived job table (shared/traces/README.md): tenant = ``cluster``."""
    reading = _Reading()
    for line, row in _rows(path):
        where = f"{path}:{line}"
        gpus = _count(where, row, "num_gpus")
        runtime = _number(where, row, "duration")
        if not gpus or gpus < 0:
            reading.leave_out(NO_GPUS)
        elif runtime <= 0:
            reading.leave_out(RAN_NO_TIME)
        else:
            submit = _when(where, row["timestamp"], "timestamp")
            reading.add(where, _job(f"philly-{line}", submit, row["cluster"], gpus, runtime, gpus_per_node))
    return reading


def _philly_json(path: Path, gpus_per_node: int) -> _Reading:
    """Philly's ``cluster_job_log``: the GPUs of the job's last attempt (the machines it ran on and
    the GPUs on each), the runtime the sum of its attempts (each attempt ran from the start again).
    A job whose last attempt never ended in the trace is left out, as is one with an attempt that
    ends before it starts."""
    try:
        records: Any = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a cluster_job_log JSON array: {exc}") from exc
    if not isinstance(records, list):
        raise TraceError(f"{path}: not a cluster_job_log JSON array")
    reading = _Reading()
    for index, record in enumerate(records, start=1):
        where = f"{path}: job {index}"
        if not isinstance(record, dict):
            raise TraceError(f"{where}: not an object")
        ran = _philly_attempts(where, _listed(where, record, "attempts"))
        submit = _moment(where, record.get("submitted_time"), "submitted_time")
        if isinstance(ran, str) or submit is None:
            reading.leave_out(ran if isinstance(ran, str) else NO_SUBMISSION)
            continue
        gpus, runtime = ran
        job_id = str(record.get("jobid") or f"philly-{index}")
        reading.add(where, _job(job_id, submit, str(record.get("vc") or ""), gpus, runtime, gpus_per_node))
    return reading


def _philly_attempts(where: str, attempts: list[Any]) -> tuple[int, float] | str:
    """(the GPUs of the job's last attempt, the time its attempts ran), or why it is left out."""
    runtime = 0.0
    gpus = 0
    last_ended: bool | None = None  # None: no attempt started
    for attempt in attempts:
        if not isinstance(attempt, dict):
            raise TraceError(f"{where}: an attempt is not an object")
        start = _moment(where, attempt.get("start_time"), "start_time")
        end = _moment(where, attempt.get("end_time"), "end_time")
        if start is None:
            continue  # an attempt that never started
        last_ended = end is not None
        if end is None:
            continue  # only whether the last attempt ended says whether the job did
        if end < start:
            return ENDS_BEFORE_START
        runtime += end - start
        gpus = 0
        for machine in _listed(where, attempt, "detail"):
            if not isinstance(machine, dict):
                raise TraceError(f"{where}: a machine of an attempt is not an object")
            gpus += len(_listed(where, machine, "gpus"))
    if last_ended is None:
        return NEVER_STARTED
    if not last_ended:
        return NEVER_ENDED
    if gpus <= 0:
        return NO_GPUS
    if runtime <= 0:
        return RAN_NO_TIME
    return gpus, runtime


def _listed(where: str, record: dict[str, Any], key: str) -> list[Any]:
    """A list field of a JSON object (missing or null: none)."""
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TraceError(f"{where}: {key}: not a list: {value!r}"[:300])
    return value


def _helios(path: Path, gpus_per_node: int) -> _Reading:
    """Helios ``cluster_log.csv``: tenant = ``vc``, learners = ``node_num`` when the GPUs divide
    evenly over the nodes, runtime = end - start."""
    reading = _Reading()
    for line, row in _rows(path):
        where = f"{path}:{line}"
        gpus = _count(where, row, "gpu_num") or 0
        if gpus <= 0:  # a CPU job: its times are not read (Slurm writes Unknown for one never started)
            reading.leave_out(NO_GPUS)
            continue
        ran = _runtime_of(
            gpus, _moment(where, row["start_time"], "start_time"), _moment(where, row["end_time"], "end_time")
        )
        if isinstance(ran, str):
            reading.leave_out(ran)
            continue
        submit = _when(where, row["submit_time"], "submit_time")
        nodes = _count(where, row, "node_num") or 1
        per_node = gpus // nodes if nodes > 0 and gpus % nodes == 0 else 0
        if nodes > 1 and 0 < per_node <= gpus_per_node:
            job = TraceJob(row["job_id"], submit, row["vc"] or "default", nodes, per_node, max(ran, 1.0))
        else:
            job = _job(row["job_id"], submit, row["vc"], gpus, ran, gpus_per_node)
        reading.add(where, job)
    return reading


def _runtime_of(gpus: int, start: float | None, end: float | None) -> float | str:
    """How long a job of ``gpus`` that ran from ``start`` to ``end`` (None: it never got there) ran,
    or why it is left out."""
    if gpus <= 0:
        return NO_GPUS
    if start is None:
        return NEVER_STARTED
    if end is None:
        return NEVER_ENDED
    if end < start:
        return ENDS_BEFORE_START
    if end == start:
        return RAN_NO_TIME
    return end - start


def _openb(path: Path, gpus_per_node: int) -> _Reading:
    """Alibaba 2023 ``openb_pod_list``: one pod a job; ``num_gpu`` GPUs (a pod with a share of
    one, ``gpu_milli`` under 1000, takes a whole GPU); tenant and priority from ``qos``; runtime
    from scheduling to deletion."""
    reading = _Reading()
    for line, row in _rows(path):
        where = f"{path}:{line}"
        gpus = _count(where, row, "num_gpu") or 0
        if gpus <= 0:
            reading.leave_out(NO_GPUS)
            continue
        ran = _runtime_of(
            gpus, _optional(where, row, "scheduled_time"), _optional(where, row, "deletion_time")
        )
        if isinstance(ran, str):
            reading.leave_out(ran)
            continue
        submit = _number(where, row, "creation_time")
        qos = row["qos"] or "default"
        reading.add(
            where, _job(row["name"], submit, qos, gpus, ran, gpus_per_node, OPENB_PRIORITY.get(qos, 0))
        )
    return reading


def _pai(job_table: Path, task_table: Path, gpus_per_node: int) -> _Reading:
    """Alibaba PAI 2020: the job table gives the tenant (``user``) and the submission time; the
    job's GPU tasks that started give its GPUs (each instance ``plan_gpu`` / 100 GPUs, rounded up:
    the instances are its learners when they are all of one size that fits a node, else the sum
    is shaped as any job's) and its runtime (first start to last end of those tasks). A time of 0
    is no time, as Alibaba's own analysis reads it (a task that never launched)."""
    for table in (job_table, task_table):
        if not table.is_file():
            raise TraceError(
                f"{table}: not found; read as an Alibaba PAI 2020 trace (a CSV of "
                f"{len(PAI_JOB)} or {len(PAI_TASK)} columns without a header, or a directory), "
                "whose pai_job_table.csv and pai_task_table.csv lie side by side"
            )
    users: dict[str, tuple[str, float | None, int]] = {}  # job -> (its user, its start, its line)
    for line, row in _rows(job_table, PAI_JOB):
        where = f"{job_table}:{line}"
        name = row["job_name"]
        if name in users:
            raise TraceError(f"{where}: job {name!r} again (first at line {users[name][2]})")
        users[name] = (row["user"], _pai_time(where, row, "start_time"), line)
    tasks: dict[str, list[tuple[int, int, float, float | None]]] = {}  # job -> its GPU tasks that started
    with_gpus: set[str] = set()  # the jobs with a task that plans GPUs
    for line, row in _rows(task_table, PAI_TASK):
        where = f"{task_table}:{line}"
        plan = _optional(where, row, "plan_gpu") or 0.0
        count = _count(where, row, "inst_num") or 0
        if plan <= 0 or count <= 0:
            continue  # a task without GPUs (a parameter server): the job's GPUs are its other tasks'
        name = row["job_name"]
        if name not in users:
            raise TraceError(f"{where}: job {name!r} is not in {job_table.name}")
        with_gpus.add(name)
        start = _pai_time(where, row, "start_time")
        if start is not None:  # one that never launched (an evaluator left waiting) held no GPUs
            end = _pai_time(where, row, "end_time")
            tasks.setdefault(name, []).append((count, math.ceil(plan / 100), start, end))
    reading = _Reading()
    for name, (user, submitted, line) in users.items():
        ran = _pai_job(tasks.get(name, [])) if name in with_gpus else NO_GPUS
        if isinstance(ran, str):
            reading.leave_out(ran)
            continue
        first, runtime = ran
        started = tasks[name]
        gpus = sum(count * per for count, per, _, _ in started)
        submit = submitted if submitted is not None else first
        sizes = {per for _, per, _, _ in started}
        if len(sizes) == 1 and (per := sizes.pop()) <= gpus_per_node:
            job = TraceJob(name, submit, user or "default", gpus // per, per, max(runtime, 1.0))
        else:
            job = _job(name, submit, user, gpus, runtime, gpus_per_node)
        reading.add(f"{job_table}:{line}", job)
    return reading


def _pai_time(where: str, row: dict[str, str], column: str) -> float | None:
    """A PAI time: 0 (or less) is none, as for a task that never launched."""
    value = _optional(where, row, column)
    return value if value is not None and value > 0 else None


def _pai_job(started: list[tuple[int, int, float, float | None]]) -> tuple[float, float] | str:
    """(first start, runtime) of a PAI job from its GPU tasks that started, or why it is left out:
    one of them never ended (it still ran when the trace ends), or ends before it starts."""
    if not started:
        return NEVER_STARTED
    ends = [end for _, _, _, end in started]
    if any(end is None for end in ends):
        return NEVER_ENDED
    first = min(start for _, _, start, _ in started)
    last = max(end for end in ends if end is not None)
    if any(end is not None and end < start for _, _, start, end in started):
        return ENDS_BEFORE_START
    return (first, last - first) if last > first else RAN_NO_TIME
