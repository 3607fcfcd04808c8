"""Replay benchmark: rebuild every projection from a 1,000,000-event log, against only decoding it.

The log is generated once through the real decider (``generated_events`` in
``tests/golden/record.py``, with its owner and job scripts) and kept in a temporary file for later
runs: 64 lanes of two GPUs each run jobs back to back (two learners, progress every 10 steps, a
checkpoint every 50), with a realistic mix of lives: most complete, others restart after a killed
or hung learner, are halted and resumed, cancelled, fail after their restarts, or get a command
rejected. Lanes start new jobs until the log holds the target number of events; jobs under way then
run to their end, so the log is a little longer. Lanes interleave in time; positions are those of
an 8-partition log.

Measured in one run, each over the whole file:

* ``decode``: only decoding every line, the path ``replay`` and ``verify`` take (``decode_line``:
  the trusted decode of a line as ``export`` writes it, without validating it again), the limit
  for a rebuild;
* ``decode (validated)``: the same lines through ``json.loads`` and pydantic validation
  (``any_event_from_dict``), the decode of every read before the trusted path, for comparison;
* ``rebuild``: ``ffdl replay LOG --rebuild`` in process (``rebuild_file``: decode and fold in one
  folder process per CPU, write SQLite in this one), and its ratio to ``decode`` (target: at least
  0.5, and 50,000 events/s);
* ``verify``: the ``ffdl verify LOG --json`` command, as a subprocess, start-up included.

Each is reported in wall-clock time and in CPU time (the process's own and its children's: the
rebuild's folders, the ``verify`` subprocess): on a machine shared with other work the CPU-time rates
are the steadier ones. The rebuild's CPU time is that of all its processes, so its CPU ratio to
``decode`` says what the rebuild costs, not how fast it runs on several CPUs.

Run from the repository root (the first run generates the log, a few minutes on one core):

    .venv/bin/python -m bench.replay_bench [--events N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ffdl.events.codec import any_event_from_dict
from ffdl.tools.log_files import decode_line, split_line
from ffdl.tools.sre import rebuild_file
from ffdl.wiring.logging import configure_logging
from tests.golden.record import GENERATED_LOG_VERSION, write_generated_log


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock and CPU seconds of one measurement (CPU time says more on a shared machine)."""

    wall_s: float
    cpu_s: float

    def figures(self, events: int) -> dict[str, float]:
        return {
            "seconds": round(self.wall_s, 2),
            "cpu_seconds": round(self.cpu_s, 2),
            "events_per_s": round(events / self.wall_s),
            "events_per_cpu_s": round(events / self.cpu_s),
        }


@contextmanager
def timed(into: list[Timing]) -> Iterator[None]:
    """Time the block; its CPU time is this process's and that of the processes it waited for (the
    rebuild's folders, the ``verify`` subprocess)."""

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + usage.ru_utime + usage.ru_stime

    wall, started = time.perf_counter(), cpu()
    yield
    into.append(Timing(time.perf_counter() - wall, cpu() - started))


def measure_decode(path: Path) -> Timing:
    timing: list[Timing] = []
    with timed(timing), path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            decode_line(text, number)
    return timing[0]


def measure_validated_decode(path: Path) -> Timing:
    timing: list[Timing] = []
    with timed(timing), path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            any_event_from_dict(split_line(text, number)[0])
    return timing[0]


def measure_rebuild(path: Path, work: Path) -> tuple[Timing, dict[str, Any]]:
    out = work / "projections.sqlite"
    for leftover in work.glob("projections.sqlite*"):
        leftover.unlink()
    timing: list[Timing] = []
    with timed(timing):
        report = rebuild_file(path, out)
    return timing[0], report


def measure_verify(path: Path) -> tuple[Timing, dict[str, Any]]:
    ffdl = Path(sys.executable).with_name("ffdl")
    timing: list[Timing] = []
    with timed(timing):
        done = subprocess.run(
            [str(ffdl), "verify", str(path), "--json"], capture_output=True, text=True, check=False
        )
    report: dict[str, Any] = json.loads(done.stdout)
    return timing[0], report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the generated log")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ffdl-replay-bench")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    configure_logging("console", "warning")  # stdout carries only the report
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / f"events-{args.events}-v{GENERATED_LOG_VERSION}.jsonl"
    if not log.exists():
        started = time.perf_counter()
        partial = log.with_suffix(".partial")
        generated = write_generated_log(partial, args.events)
        partial.rename(log)
        elapsed = time.perf_counter() - started
        print(f"generated {generated:,} events into {log} in {elapsed:.0f} s", file=sys.stderr)
    with log.open(encoding="utf-8") as lines:
        events = sum(1 for _ in lines)
    load_before = os.getloadavg()[0]
    decode = measure_decode(log)
    validated = measure_validated_decode(log)
    rebuild, rebuilt = measure_rebuild(log, args.work)
    verify, verified = measure_verify(log)
    figures = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "log": str(log),
        "log_bytes": log.stat().st_size,
        "events": events,
        "jobs": rebuilt["jobs"],
        "decode": decode.figures(events),
        "decode_validated": validated.figures(events),
        "rebuild": {
            **rebuild.figures(events),
            "ratio_to_decode": round(decode.wall_s / rebuild.wall_s, 3),
            "cpu_ratio_to_decode": round(decode.cpu_s / rebuild.cpu_s, 3),
            "applied": rebuilt["applied"],
            "states": rebuilt["states"],
        },
        "verify": {**verify.figures(events), "violations": len(verified["violations"])},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"log: {events:,} events of {rebuilt['jobs']:,} jobs, {figures['log_bytes'] / 1e6:,.0f} MB ({log})")
    print(f"load average (1 min) before and after: {figures['load_average_1m']} on {os.cpu_count()} CPUs")
    measured = (
        ("decode only", decode),
        ("decode (validated)", validated),
        ("rebuild", rebuild),
        ("verify (CLI)", verify),
    )
    for name, timing in measured:
        print(
            f"{name:<18} {events / timing.wall_s:>9,.0f} events/s ({timing.wall_s:.1f} s), "
            f"{events / timing.cpu_s:>9,.0f} events/CPU-s"
        )
    print(
        f"rebuild / decode: {decode.wall_s / rebuild.wall_s:.2f} (wall clock), "
        f"{decode.cpu_s / rebuild.cpu_s:.2f} (CPU time); violations: {len(verified['violations'])}"
    )


if __name__ == "__main__":
    main()
