"""Terminal rendering for the CLI: rich tables with a colour per state, or JSON with ``--json``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

STATE_STYLE = {
    "SUBMITTED": "white", "QUEUED": "yellow", "SCHEDULED": "cyan", "LAUNCHING": "cyan", "RUNNING": "green",
    "RESTARTING": "magenta", "HALTING": "blue", "HALTED": "blue", "STORING": "cyan", "COMPLETED": "bold green",
    "FAILED": "bold red", "CANCELLED": "dim",
}

console = Console()


def styled(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


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
        if end is None and entry["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
            end = entry["at"]
        at = datetime.fromisoformat(entry["at"]).strftime("%H:%M:%S.%f")[:-3]
        table.add_row(str(entry["seq"]), styled(entry["state"]), at, _duration(entry["at"], end), entry["reason"])
    return table


def job_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table()
    for column in ("job", "tenant", "state", "learners", "attempt", "submitted", "reason"):
        table.add_column(column)
    for job in jobs:
        table.add_row(job["job_id"], job["tenant"], styled(job["state"]),
                      f"{job['spec']['learners']}x{job['spec']['gpus']} GPU", str(job["attempt"]),
                      job["submitted_at"], job["reason"])
    return table


def learners_table(job: dict[str, Any]) -> Table:
    table = Table(title=f"{job['job_id']}: {styled(job['state'])}")
    for column in ("rank", "status", "node", "gpus", "step", "metrics", "exit"):
        table.add_column(column)
    for learner in job["learners"]:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(learner["metrics"].items()))
        table.add_row(str(learner["rank"]), learner["status"], learner["node"], ",".join(map(str, learner["gpus"])),
                      str(learner["step"]), metrics, "" if learner["exit_code"] is None else str(learner["exit_code"]))
    return table
