"""Time-machine benchmark: a read of the cluster as it is now, on a long log, kept against afresh.

    .venv/bin/python -m bench.timemachine_bench [--jobs 1000] [--progress 150] [--new 200] [--json]

The log: ``--jobs`` copies of the golden happy path's job (``tests/golden``), each with
``--progress`` more progress events (so 1,000 jobs of 150 make about 197,000 events), 30 s apart,
projected into a fresh projection file. Then ``--new`` events arrive (a later copy of the last
job's), as learners' progress does while a cluster page is open, and the page reads the present
again. Measured in one run:

* ``afresh``: what every read did before the log was kept: decode every event of the projection,
  fold them all, and the utilisation over them (a new :class:`KeptLog` and :class:`ClusterAtEnd`);
* ``kept``: the same read by the API's kept reader after the new events: it decodes those and folds
  them on (:class:`KeptLog`, :class:`ClusterAtEnd`).

Both give the same picture (checked). Reported in wall seconds and as the ratio afresh / kept.

Then past moments (``PAST``, as fractions of the log), each new: ``past_from_start``, what a read
of a past moment did before (fold every event up to it), against ``past_from_copy``, the kept
reader's (:meth:`ClusterAtEnd.folded_at`: fold on from the last copy kept before it). Both the
picture and everything else :func:`cluster_at` does are in the times; the pictures are checked
equal. The kept reader decodes only the events it folds: ``past_from_copy`` includes reading them
back from the projection file.

Last, ``kept_bytes_per_event``: what a kept log holds per event once it has read the whole file
(``tracemalloc``; it keeps where each event is, not the event).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import tempfile
import time
import tracemalloc
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from ffdl.projections.store import KeptLog, LoggedEvent, Projection
from ffdl.projections.timemachine import ClusterAtEnd, cluster_at, kept_picture
from ffdl.tools.log_files import read_log
from tests.golden.record import GOLDEN_DIR


def long_log(jobs: int, progress: int) -> list[LoggedEvent]:
    """``jobs`` copies of the happy path's job, each with ``progress`` more progress events."""
    base = [json.loads(line) for line in (GOLDEN_DIR / "happy_path.events.jsonl").read_text().splitlines()]
    at = next(index for index, line in enumerate(base) if line["type"] == "LearnerProgressed")
    lines: list[dict[str, Any]] = []
    for job in range(jobs):
        extra = []
        for step in range(progress):
            line = copy.deepcopy(base[at])
            line["data"]["step"] = base[at]["data"]["step"] + 1 + step
            extra.append(line)
        for seq, original in enumerate([*base[: at + 1], *extra, *base[at + 1 :]], start=1):
            line = dict(original, job_id=f"job{job}-7f3a", seq=seq, event_id=str(uuid.uuid4()))
            line["position"] = f"0:{len(lines)}"
            lines.append(line)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as out:
        out.write("\n".join(json.dumps(line) for line in lines) + "\n")
    events = list(read_log(Path(out.name)))
    Path(out.name).unlink()
    spread = []
    for job in range(jobs):  # each job 30 s after the one before
        chunk = events[job * (len(events) // jobs) : (job + 1) * (len(events) // jobs)]
        for logged in chunk:
            moved = logged.event.model_copy(
                update={"occurred_at": logged.event.occurred_at + timedelta(seconds=30 * job)}
            )
            spread.append(LoggedEvent(moved, logged.partition, logged.offset))
    return spread


#: the past moments read, as fractions of the log: a tenant stepping through its history
PAST = (0.1, 0.35, 0.5, 0.8, 0.97)


def read_now(log: KeptLog, at_end: ClusterAtEnd) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    started = time.perf_counter()
    picture, series = kept_picture(log, at_end, None)
    return picture, series, time.perf_counter() - started


def kept_bytes(projection: Projection) -> float:
    """What a kept log holds per event once it has read the whole file (``tracemalloc``)."""
    gc.collect()
    tracemalloc.start()
    try:
        entries = KeptLog(projection).located()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held / len(entries)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--progress", type=int, default=150)
    parser.add_argument("--new", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    events = long_log(args.jobs, args.progress)
    with tempfile.TemporaryDirectory() as directory:
        projection = Projection(Path(directory) / "projections.sqlite")
        for start in range(0, len(events), 5000):
            projection.apply(events[start : start + 5000])
        kept, at_end = KeptLog(projection), ClusterAtEnd()
        _, _, first = read_now(kept, at_end)  # the API's first read: the whole log, once
        later = events[-args.new :]
        day = timedelta(days=1)
        projection.apply(
            [
                LoggedEvent(
                    e.event.model_copy(
                        update={"event_id": uuid.uuid4(), "occurred_at": e.event.occurred_at + day}
                    ),
                    1,
                    i,
                )
                for i, e in enumerate(later)
            ]
        )
        picture, series, kept_s = read_now(kept, at_end)
        fresh_picture, fresh_series, afresh_s = read_now(KeptLog(projection), ClusterAtEnd())
        assert (picture, series) == (fresh_picture, fresh_series), "the kept read differs from a fold afresh"
        past_from_start, past_kept = [], []
        logged = list(kept.events(kept.located()))
        for fraction in PAST:  # moments a tenant steps through: each a new one
            moment = logged[int(len(logged) * fraction)].event.occurred_at
            started = time.perf_counter()
            from_start = cluster_at(logged, moment)
            past_from_start.append(time.perf_counter() - started)
            started = time.perf_counter()
            from_copy, _ = kept_picture(kept, at_end, moment)
            past_kept.append(time.perf_counter() - started)
            assert from_copy == from_start, "a past moment folded on from a copy differs from a fold afresh"
        del logged
        per_event = kept_bytes(projection)
        projection.close()
    figures = {
        "events": len(events) + args.new,
        "new_events": args.new,
        "first_read_s": round(first, 3),
        "afresh_s": round(afresh_s, 3),
        "kept_s": round(kept_s, 4),
        "afresh_over_kept": round(afresh_s / kept_s, 1),
        "past_from_start_s": round(sum(past_from_start) / len(PAST), 3),
        "past_from_copy_s": round(sum(past_kept) / len(PAST), 3),
        "past_from_start_over_copy": round(sum(past_from_start) / sum(past_kept), 1),
        "kept_bytes_per_event": round(per_event),
    }
    if args.json:
        print(json.dumps(figures))
        return
    for name, value in figures.items():
        print(f"{name:>18}: {value}")


if __name__ == "__main__":
    main()
