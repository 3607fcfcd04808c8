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

* ``decode``: only decoding every line, the same JSON and pydantic path ``replay`` takes
  (``decode_line``: ``json.loads`` then ``event_from_dict``), the limit for a rebuild;
* ``rebuild``: ``ffdl replay LOG --rebuild`` in process (``rebuild_file``: decode, fold, write
  SQLite), and its ratio to ``decode`` (target: at least 0.5, and 50,000 events/s);
* ``verify``: the ``ffdl verify LOG --json`` command, as a subprocess, start-up included.

Run from the repository root (the first run generates the log, a few minutes on one core):

    .venv/bin/python -m bench.replay_bench [--events N] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ffdl.adapters.log_files import decode_line
from ffdl.adapters.sre import rebuild_file
from tests.golden.record import GENERATED_LOG_VERSION, write_generated_log


def measure_decode(path: Path) -> float:
    started = time.perf_counter()
    with path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            decode_line(text, number)
    return time.perf_counter() - started


def measure_rebuild(path: Path, work: Path) -> tuple[float, dict[str, Any]]:
    out = work / "projections.sqlite"
    for leftover in work.glob("projections.sqlite*"):
        leftover.unlink()
    started = time.perf_counter()
    report = rebuild_file(path, out)
    return time.perf_counter() - started, report


def measure_verify(path: Path) -> tuple[float, dict[str, Any]]:
    ffdl = Path(sys.executable).with_name("ffdl")
    started = time.perf_counter()
    done = subprocess.run(
        [str(ffdl), "verify", str(path), "--json"], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    report: dict[str, Any] = json.loads(done.stdout)
    return elapsed, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the generated log")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ffdl-replay-bench")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / f"events-{args.events}-v{GENERATED_LOG_VERSION}.jsonl"
    if not log.exists():
        started = time.perf_counter()
        partial = log.with_suffix(".partial")
        generated = write_generated_log(partial, args.events)
        partial.rename(log)
        print(
            f"generated {generated:,} events into {log} in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
    with log.open(encoding="utf-8") as lines:
        events = sum(1 for _ in lines)
    decode_s = measure_decode(log)
    rebuild_s, rebuilt = measure_rebuild(log, args.work)
    verify_s, verified = measure_verify(log)
    decode_rate, rebuild_rate, verify_rate = events / decode_s, events / rebuild_s, events / verify_s
    figures = {
        "python": platform.python_version(),
        "log": str(log),
        "log_bytes": log.stat().st_size,
        "events": events,
        "jobs": rebuilt["jobs"],
        "decode": {"seconds": round(decode_s, 2), "events_per_s": round(decode_rate)},
        "rebuild": {
            "seconds": round(rebuild_s, 2),
            "events_per_s": round(rebuild_rate),
            "ratio_to_decode": round(rebuild_rate / decode_rate, 3),
            "applied": rebuilt["applied"],
            "states": rebuilt["states"],
        },
        "verify": {
            "seconds": round(verify_s, 2),
            "events_per_s": round(verify_rate),
            "violations": len(verified["violations"]),
        },
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"log: {events:,} events of {rebuilt['jobs']:,} jobs, {figures['log_bytes'] / 1e6:,.0f} MB ({log})")
    print(f"decode only: {decode_rate:>10,.0f} events/s ({decode_s:.1f} s)")
    print(
        f"rebuild:     {rebuild_rate:>10,.0f} events/s ({rebuild_s:.1f} s), "
        f"{rebuild_rate / decode_rate:.2f} of the decode rate"
    )
    print(
        f"verify:      {verify_rate:>10,.0f} events/s ({verify_s:.1f} s, the CLI), "
        f"{len(verified['violations'])} violation(s)"
    )


if __name__ == "__main__":
    main()
