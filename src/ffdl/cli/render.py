"""Terminal rendering for the CLI: rich tables with a colour per state, or JSON with ``--json``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import yaml
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ffdl.core.states import JobState
from ffdl.tools.terminal import shown

STATE_STYLE = {
    "SUBMITTED": "white",
    "QUEUED": "yellow",
    "SCHEDULED": "cyan",
    "LAUNCHING": "cyan",
    "RUNNING": "green",
    "RESTARTING": "magenta",
    "HALTING": "blue",
    "HALTED": "blue",
    "STORING": "cyan",
    "COMPLETED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}

console = Console()
#: For what must not mix with data written to standard output (``ffdl export -o -``).
err_console = Console(stderr=True)


def styled(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def print_table(table: Table, *, wide: bool = False) -> None:
    """A table on the terminal; a ``wide`` one as wide as its cells need, past the terminal's width
    (as kubectl's ``-o wide`` lines run on) rather than squeezed into it."""
    if wide:
        needed = Measurement.get(console, console.options.update(width=10_000), table).maximum
        # print's own width is capped at the console's, and setting the shared console's width would
        # pin it for good (it follows the terminal only while unset): a console of that width, once
        Console(width=max(console.width, needed)).print(table)
    else:
        console.print(table)


def print_yaml(value: Any) -> None:
    print(yaml.safe_dump(value, sort_keys=True, allow_unicode=True), end="")


def age(iso: str, now: datetime | None = None) -> str:
    """How long ago, as kubectl writes it: ``12s``, ``3m``, ``5h``, ``4d`` (``2m30s`` under ten minutes)."""
    then = datetime.fromisoformat(iso)
    elapsed = int(((now or datetime.now(UTC)) - then).total_seconds())
    if elapsed < 60:
        return f"{max(elapsed, 0)}s"
    minutes, secs = divmod(elapsed, 60)
    if minutes < 10:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _duration(start: str, end: str | None) -> str:
    if end is None:
        return "…"
    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return f"{seconds:.1f}s"


def timeline_table(job: dict[str, Any]) -> Table:
    table = Table(title=f"timeline of {job['job_id']}")
    for column in ("#", "state", "entered at", "for", "reason"):
        table.add_column(column)
    history = job["history"]
    for index, entry in enumerate(history):
        end = history[index + 1]["at"] if index + 1 < len(history) else None
        if end is None and JobState(entry["state"]).terminal:
            end = entry["at"]
        at = datetime.fromisoformat(entry["at"]).strftime("%H:%M:%S.%f")[:-3]
        duration = _duration(entry["at"], end)
        table.add_row(str(entry["seq"]), styled(entry["state"]), at, duration, shown(entry["reason"]))
    return table


def job_table(jobs: list[dict[str, Any]], *, wide: bool = False, now: datetime | None = None) -> Table:
    """One row per job: the id and state never cut (the reason folds instead), the age relative;
    ``wide`` adds the tenant, attempt, restarts, nodes and the submission time."""
    table = Table()
    longest = max((len(job["job_id"]) for job in jobs), default=3)
    table.add_column("job", no_wrap=True, min_width=longest)
    table.add_column("state", no_wrap=True, min_width=10)
    table.add_column("gpus", no_wrap=True)
    table.add_column("age", no_wrap=True)
    if wide:
        for column in ("tenant", "attempt", "restarts", "nodes", "submitted"):
            table.add_column(column, no_wrap=column != "nodes")
    table.add_column("reason", overflow="fold")
    for job in jobs:
        row = [
            shown(job["job_id"]),
            styled(job["state"]),
            f"{job['spec']['learners']}x{job['spec']['gpus']}",
            age(job["submitted_at"], now),
        ]
        if wide:
            nodes = sorted({p["node"] for p in job["placement"] or []})
            row += [
                shown(job["tenant"]),
                str(job["attempt"]),
                str(job["restarts"]),
                ",".join(nodes),
                when(job["submitted_at"]),
            ]
        table.add_row(*row, shown(job["reason"]))
    return table


def learners_table(job: dict[str, Any], *, wide: bool = False) -> Table:
    """The job's learners; ``wide`` adds where each runs (host, pid) and when it last progressed."""
    table = Table(title=f"{shown(job['job_id'])}: {styled(job['state'])}")
    columns = ["rank", "status", "node", "gpus", "step", "metrics", "exit"]
    for column in columns + (["host", "pid", "progressed"] if wide else []):
        table.add_column(column)
    for learner in job["learners"]:
        metrics = ", ".join(f"{shown(k)}={v:.4g}" for k, v in sorted(learner["metrics"].items()))
        gpus = ",".join(map(str, learner["gpus"]))
        exit_code = "" if learner["exit_code"] is None else str(learner["exit_code"])
        rank, step = str(learner["rank"]), str(learner["step"])
        row = [rank, learner["status"], learner["node"], gpus, step, metrics, exit_code]
        if wide:
            progressed = learner["last_progress_at"]
            row += [
                shown(learner["host"] or ""),
                str(learner["pid"] or ""),
                age(progressed) if progressed else "",
            ]
        table.add_row(*row)
    return table


# -- SRE views: replay, diff, verify ---------------------------------------------------------------


def seconds(value: float | None) -> str:
    """A duration for people: ``0.4s``, ``12.3s``, ``3m12s``, ``2h05m``; ``…`` when unknown."""
    if value is None:
        return "…"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def replay_timeline_table(job_id: str, rows: list[dict[str, Any]]) -> Table:
    """A replayed job's states: when each was entered, by which event, for how long, and why."""
    table = Table(title=f"timeline of {shown(job_id)}")
    for column in ("seq", "state", "entered at", "for", "event", "reason"):
        table.add_column(column)
    day = None
    for row in rows:
        duration = "" if row["duration_s"] is None else seconds(row["duration_s"])
        if row["ongoing"]:
            duration += " (ongoing)"
        entered = datetime.fromisoformat(row["entered_at"])
        at = entered.strftime("%H:%M:%S.%f")[:-3]
        if entered.date() != day:  # the date once, and again where it changes
            day = entered.date()
            at = f"{day.isoformat()} {at}"
        table.add_row(str(row["seq"]), styled(row["state"]), at, duration, row["event"], shown(row["reason"]))
    return table


def replay_lines(report: dict[str, Any]) -> list[str]:
    """The headline of a replayed job: where the replay stopped, what it holds, what was skipped."""
    state, point = report["state"], report["point"]
    lines = [
        f"job [bold]{shown(report['job_id'])}[/] (tenant {shown(report['tenant'])}) "
        f"at seq {point['seq']}, {point['at']} "
        f"(position {point['position']}): {styled(state['state'])}, attempt {state['attempt']}, "
        f"{state['restarts']} restart(s)"
    ]
    if state["reason"]:
        lines.append(f"reason: {shown(state['reason'])}")
    if state["placement"]:
        held = ", ".join(
            f"rank {p['rank']} on {p['node']} GPUs {','.join(map(str, p['gpus']))}"
            for p in state["placement"]
        )
        lines.append(f"placement: {held}")
    checkpoint = state["latest_checkpoint"]
    if checkpoint:
        lines.append(
            f"latest checkpoint: step {checkpoint['step']} (attempt {checkpoint['attempt']}) "
            f"at {shown(checkpoint['uri'])}"
        )
    for skipped in report["skipped"]:
        lines.append(
            f"[yellow]skipped[/] seq {skipped['seq']} {skipped['type']} at {skipped['position']}: "
            f"{shown(skipped['reason'])}"
        )
    return lines


def diff_table(report: dict[str, Any]) -> Table:
    """What changed in a job between two points, field by field."""
    before, after = report["from"], report["to"]
    table = Table(
        title=f"{shown(report['job_id'])}: "
        f"seq {before['seq']} ({before['at']}) → seq {after['seq']} ({after['at']})"
    )
    for column in ("field", "before", "after"):
        table.add_column(column)
    for change in report["changes"]:
        old, new = change["before"], change["after"]
        if change["field"] == "state":
            table.add_row("state", styled(str(old)), styled(str(new)))
        else:
            table.add_row(change["field"], _cell(old), _cell(new))
    for checkpoint in report["checkpoints"]["added"]:
        table.add_row("checkpoint added", "", f"step {checkpoint['step']}: {shown(checkpoint['uri'])}")
    for checkpoint in report["checkpoints"]["removed"]:
        table.add_row("checkpoint dropped", f"step {checkpoint['step']}: {shown(checkpoint['uri'])}", "")
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "[dim]none[/]"
    return shown(value if isinstance(value, str) else json.dumps(value))


def violations_table(violations: list[dict[str, str]]) -> Table:
    table = Table(title="invariant violations", title_style="bold red")
    for column in ("kind", "job", "position", "detail"):
        table.add_column(column)
    for violation in violations:
        kind = f"[red]{violation['kind']}[/]"
        table.add_row(kind, shown(violation["job_id"]), violation["position"], shown(violation["detail"]))
    return table


NODE_STATUS_STYLE = {
    "READY": "green",
    "CORDONED": "yellow",
    "DRAINING": "magenta",
    "LOST": "bold red",
    "REMOVED": "dim",
}


def node_status(status: str) -> str:
    return f"[{NODE_STATUS_STYLE.get(status, 'white')}]{status}[/]"


def cordon_text(node: dict[str, Any]) -> str:
    cordon = node["cordon"]
    if cordon is None:
        return ""
    return f"{'drain' if cordon['drain'] else 'cordon'} by {cordon['source']}: {cordon['reason']}"


def nodes_table(nodes: list[dict[str, Any]], *, wide: bool = False) -> Table:
    """One row per node; ``wide`` adds since when it has its status, and why."""
    table = Table()
    for column in ("node", "status", "gpus", "cpus", "memory"):
        table.add_column(column, no_wrap=True)
    if wide:
        table.add_column("age", no_wrap=True)
        table.add_column("reason", overflow="fold")
    table.add_column("cordon", overflow="fold")
    for node in nodes:
        row = [
            node["name"],
            node_status(node["status"]),
            f"{node['gpus']} x {shown(node['gpu_type'])}",
            f"{node['cpus']:g}",
            f"{node['memory_mb']} MB",
        ]
        if wide:
            row += [age(node["since"]), shown(node["reason"] or "")]
        table.add_row(*row, shown(cordon_text(node)))
    return table


def when(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S")


def node_line(node: dict[str, Any]) -> str:
    cordon = cordon_text(node)
    return f"{node['name']}: {node_status(node['status'])}" + (f" ({shown(cordon)})" if cordon else "")


def node_timeline_table(name: str, rows: list[dict[str, Any]]) -> Table:
    """``ffdl replay --node``: one row per change of the node's status, spec or cordon."""
    table = Table(title=f"timeline of node {name}")
    for column in ("seq", "status", "entered at", "for", "event", "gpus", "reason"):
        table.add_column(column)
    for row in rows:
        duration = seconds(row["duration_s"]) + (" (ongoing)" if row["ongoing"] else "")
        table.add_row(
            str(row["seq"]),
            node_status(row["status"]),
            row["entered_at"],
            duration,
            row["event"],
            f"{row['spec']['gpus']} x {shown(row['spec']['gpu_type'])}",
            shown(row["reason"]),
        )
    return table


def cluster_tables(picture: dict[str, Any]) -> list[Table]:
    """``replay --cluster``: the GPU map (one row per node, the job holding each GPU), the queue in
    the scheduler's order and every job's state, as the time machine shows them at that moment."""
    gpus = Table(title=f"GPUs at {picture['at'] or 'the end of the log'}")
    for column in ("node", "status", "GPU", "held by"):
        gpus.add_column(column)
    for node in picture["nodes"]:
        for gpu in range(int(node["gpus"])):
            holder = node["allocated"].get(str(gpu))
            gpus.add_row(
                node["name"],
                node_status(node["status"]),
                str(gpu),
                shown(holder) if holder else "[dim]free[/]",
            )
    queue = Table(title="Queue")
    for column in ("#", "job", "tenant", "priority", "learners x GPUs", "reason"):
        queue.add_column(column)
    for row in picture["queue"]:
        queue.add_row(
            str(row["position"]),
            shown(row["job_id"]),
            shown(row["tenant"]),
            str(row["priority"]),
            f"{row['learners']} x {row['gpus']}",
            shown(row["reason"] or ""),
        )
    jobs = Table(title="Jobs")
    for column in ("job", "tenant", "state", "attempt", "GPUs held"):
        jobs.add_column(column)
    for job in picture["jobs"]:
        jobs.add_row(
            shown(job["job_id"]),
            shown(job["tenant"]),
            styled(job["state"]),
            str(job["attempt"]),
            str(job["gpus_held"]),
        )
    return [gpus, queue, jobs]
