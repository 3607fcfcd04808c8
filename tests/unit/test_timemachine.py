"""The time machine's picture of every job: each row tells why the job is in the state it was in
then, and what it holds counts as the scheduler counts it."""

from __future__ import annotations

import gc
import itertools
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events.model import JobSpec
from ffdl.projections import store, timemachine
from ffdl.projections.documents import charges_on, counts_as_gpus
from ffdl.projections.store import KeptLog, LoggedEvent, Projection
from ffdl.projections.timemachine import ClusterAtEnd, cluster_at, kept_cluster_at, kept_picture, tenant_rows
from ffdl.tools.log_files import read_log
from tests.golden.record import GOLDEN_DIR


def test_a_jobs_row_gives_the_reason_of_the_state_it_is_in_at_the_moment() -> None:
    events = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    queued_at = next(
        logged.event.occurred_at for logged in events if type(logged.event.data).__name__ == "JobQueued"
    )

    def row(at: datetime | None) -> dict[str, object]:
        [job] = cluster_at(events, at)["jobs"]
        return dict(job)

    waiting = row(queued_at)
    assert waiting["state"] == "QUEUED"
    assert "GPU" in str(waiting["reason"])
    done = row(None)
    assert done["state"] == "COMPLETED"
    assert str(done["reason"]).startswith("results recorded"), done  # not the scheduler's stale word


def events_of(kept: KeptLog) -> list[LoggedEvent]:
    return list(kept.events(kept.located()))


def test_the_kept_log_decodes_only_what_was_applied_since_it_last_read_and_keeps_time_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The time machine read and decoded the whole log for every moment asked (10 s of a 15 s
    fold on 200,000 events); the kept log reads the rows applied since, and sorts them in, and the
    present is folded on with only those decoded."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    projection = Projection(tmp_path / "projection.sqlite")
    early, late = read[: len(read) // 2], read[len(read) // 2 :]
    projection.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(early)])
    kept, at_end = KeptLog(projection), ClusterAtEnd()
    assert [entry.event.event_id for entry in events_of(kept)] == [entry.event.event_id for entry in early]
    at_end.folded(kept, kept.located())
    decoded = []
    real = store.trusted_any_event_from_json

    def counting(body: bytes) -> Any:
        decoded.append(body)
        return real(body)

    monkeypatch.setattr(store, "trusted_any_event_from_json", counting)
    assert len(kept.located()) == len(early) and not decoded, "a read decodes nothing"
    at_end.folded(kept, kept.located())
    assert not decoded, "nothing new: nothing decoded"
    projection.apply([LoggedEvent(entry.event, 1, offset) for offset, entry in enumerate(late)])
    at_end.folded(kept, kept.located())
    assert len(decoded) == len(late), "only the new events are decoded to fold the present on"
    monkeypatch.undo()
    events = events_of(kept)
    assert [entry.event.event_id for entry in events] == [entry.event.event_id for entry in read]
    [job] = cluster_at(events, None)["jobs"]
    assert job["state"] == "COMPLETED"

    projection.close()  # the file replaced by a rebuilt, shorter one: read afresh, not from the old rows
    for path in tmp_path.glob("projection.sqlite*"):
        path.unlink()
    rebuilt = Projection(tmp_path / "projection.sqlite")
    rebuilt.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(early[:3])])
    rebuilt.close()
    assert [entry.event.event_id for entry in events_of(kept)] == [
        entry.event.event_id for entry in early[:3]
    ]


@pytest.mark.parametrize("between", [1, 2])
def test_the_kept_log_loses_no_event_committed_while_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, between: int
) -> None:
    """The projector commits between two of the reader's queries: read apart, the count of rows
    once moved the cursor past rows never read, and the present missed them for good."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    half = len(read) // 2
    reader, projector = Projection(tmp_path / "p.sqlite"), Projection(tmp_path / "p.sqlite")
    projector.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(read[:half])])
    kept = KeptLog(reader)
    assert len(events_of(kept)) == half
    opened = Projection._connection
    queries = 0

    class Committing:
        def __init__(self, db: Any) -> None:
            self.db = db

        def execute(self, sql: str, *args: Any) -> Any:
            nonlocal queries
            if sql.startswith("SELECT"):
                queries += 1
                if queries == between + 1:  # after the reader's first query (or second)
                    later = read[half:]
                    projector.apply(
                        [LoggedEvent(e.event, 0, half + offset) for offset, e in enumerate(later)]
                    )
            return self.db.execute(sql, *args)

    @contextmanager
    def connection(projection: Projection) -> Iterator[Any]:
        with opened(projection) as db:
            yield Committing(db) if projection is reader else db

    monkeypatch.setattr(Projection, "_connection", connection)
    events_of(kept)
    monkeypatch.undo()
    assert [entry.event.event_id for entry in events_of(kept)] == [entry.event.event_id for entry in read]


def test_the_cluster_at_the_end_is_folded_on_from_what_was_folded_and_is_the_fresh_fold(
    tmp_path: Path,
) -> None:
    """The live page reads the present after every change: the events added since are folded on
    (the same aggregates), and one that sorts in among those folded (a partition behind) folds
    all again; either way the picture is the one a fold from the start gives."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    projection = Projection(tmp_path / "projection.sqlite")
    kept, at_end = KeptLog(projection), ClusterAtEnd()
    half = len(read) // 2
    stages = [
        [LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(read[:half])],
        [LoggedEvent(entry.event, 0, half + offset) for offset, entry in enumerate(read[half:-1])],
        [LoggedEvent(read[-1].event.model_copy(update={"occurred_at": read[0].event.occurred_at}), 1, 0)],
    ]
    folds = []
    for stage in stages:
        projection.apply(stage)
        entries = kept.located()
        folded = at_end.folded(kept, entries)
        folds.append(folded[0])
        events = events_of(kept)
        assert kept_cluster_at(kept, entries, None, folded) == cluster_at(events, None)
        afresh = ClusterAtEnd()
        afresh.folded(kept, kept.located())
        assert at_end.utilisation() == afresh.utilisation()
    assert folds[0] is folds[1], "the later events were folded on"
    assert folds[2] is not folds[1], "an earlier one sorted in: folded again"


def test_the_projection_gives_the_log_back_in_log_order_past_offset_nine(tmp_path: Path) -> None:
    """Events of one instant (one command's, say) are ordered by their offsets as numbers: as text,
    offset 10 would come before offset 9, and a job's fold would stop at the event out of order."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    instant = read[0].event.occurred_at
    logged = [
        LoggedEvent(entry.event.model_copy(update={"occurred_at": instant}), 2, offset)
        for offset, entry in enumerate(read)
    ]
    assert len(logged) > 10, "the log must cross from offset 9 to 10"
    projection = Projection(tmp_path / "projection.sqlite")
    projection.apply(logged)

    given_back = events_of(KeptLog(projection))

    assert [(entry.partition, entry.offset) for entry in given_back] == [(2, n) for n in range(len(logged))]
    assert [entry.event.event_id for entry in given_back] == [entry.event.event_id for entry in logged]
    [job] = cluster_at(given_back, None)["jobs"]
    assert job["state"] == "COMPLETED"


def node_doc(name: str, status: str = "READY") -> dict[str, Any]:
    return {"name": name, "status": status, "gpus": 8, "gpu_type": "a100", "cpus": 64.0, "memory_mb": 262_144}


def job_doc(job_id: str, tenant: str, gpus: int, cpus: float, on: str | None) -> dict[str, Any]:
    spec = JobSpec(name=job_id, command="train", gpus=gpus, cpus=cpus).model_dump(mode="json")
    placement = (
        None if on is None else [{"rank": 0, "node": on, "gpus": list(range(gpus)), "gpu_type": "a100"}]
    )
    return {"job_id": job_id, "tenant": tenant, "spec": spec, "placement": placement}


def test_what_a_job_holds_counts_as_the_scheduler_counts_it_on_the_present_nodes() -> None:
    """Two present nodes of 8 GPUs and 64 CPUs: 8 CPUs are worth a GPU. A lost node is no part of
    the inventory the scheduler shares out."""
    charges = charges_on([node_doc("n0"), node_doc("n1"), node_doc("gone", status="LOST")])
    assert counts_as_gpus(job_doc("plain", "a", 2, 4.0, "n0"), charges) == 2.0
    assert counts_as_gpus(job_doc("cpu-heavy", "a", 1, 32.0, "n0"), charges) == 4.0
    assert counts_as_gpus(job_doc("cpu-only", "a", 0, 16.0, "n1"), charges) == 2.0
    assert counts_as_gpus(job_doc("queued", "a", 4, 64.0, None), charges) == 0.0


def test_a_tenants_row_says_what_its_jobs_count_as_and_borrows_in_those_terms() -> None:
    """A tenant of jobs without GPUs once showed nothing held and nothing borrowed while the
    scheduler reclaimed its guarantee's worth from it."""
    picture = {
        "nodes": [{**node_doc("n0"), "present": True}, {**node_doc("n1"), "present": True}],
        "jobs": [
            {"tenant": "cpu", "state": "RUNNING", "gpus_held": 0, "counts_as_gpus": 6.0, "releasing": False},
            {"tenant": "cpu", "state": "HALTING", "gpus_held": 0, "counts_as_gpus": 3.0, "releasing": True},
            {"tenant": "cpu", "state": "QUEUED", "gpus_held": 0, "counts_as_gpus": 0.0, "releasing": False},
            {"tenant": "gpu", "state": "RUNNING", "gpus_held": 2, "counts_as_gpus": 2.0, "releasing": False},
        ],
    }
    policy = TenancyPolicy({"cpu": TenantQuota(guaranteed_gpus=2), "gpu": TenantQuota(guaranteed_gpus=4)})
    rows = {row["tenant"]: row for row in tenant_rows(picture, policy)}
    # it holds the worth of 9 GPUs, 3 of them on their way out: it borrows 6 - 2 as the scheduler counts
    assert (rows["cpu"]["gpus_held"], rows["cpu"]["counts_as_gpus"], rows["cpu"]["borrowed"]) == (0, 9.0, 4.0)
    assert (rows["gpu"]["gpus_held"], rows["gpu"]["counts_as_gpus"], rows["gpu"]["borrowed"]) == (2, 2.0, 0.0)
    assert rows["cpu"]["fair_share_gpus"] == rows["gpu"]["fair_share_gpus"] == 8.0  # both hold: an even split


def test_the_picture_counts_each_job_holding_a_placement_as_the_scheduler_does() -> None:
    events = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    running = next(
        logged.event.occurred_at for logged in events if type(logged.event.data).__name__ == "JobRunning"
    )
    [job] = cluster_at(events, running)["jobs"]
    assert job["gpus_held"] > 0 and job["counts_as_gpus"] == job["gpus_held"]
    assert job["releasing"] is False
    [done] = cluster_at(events, None)["jobs"]
    assert done["gpus_held"] == done["counts_as_gpus"] == 0 and done["releasing"] is False


@pytest.mark.parametrize("kept_at_most", [timemachine.SNAPSHOTS_KEPT, 2])
def test_a_past_moment_folded_on_from_a_kept_copy_is_the_fold_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_at_most: int
) -> None:
    """Every new moment a tenant asked for once folded the whole log. Now it is folded on from the
    last copy kept before it: at every event's time, between two, before the first and after the
    last, with copies thinned out, and after an event that sorts in among those folded (a
    partition behind the others), the picture is the one a fold from the start gives."""
    monkeypatch.setattr(timemachine, "SNAPSHOTS_KEPT", kept_at_most)
    read = [
        *read_log(GOLDEN_DIR / "node_drain.events.jsonl"),
        *read_log(GOLDEN_DIR / "happy_path.events.jsonl"),
    ]
    projection = Projection(tmp_path / "projection.sqlite")
    kept, at_end = KeptLog(projection), ClusterAtEnd(snapshot_every=3)
    late = read[-1].event.model_copy(update={"occurred_at": read[len(read) // 2].event.occurred_at})
    stages = [
        [LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(read[:-1])],
        [LoggedEvent(late, 1, 0)],
    ]
    for stage in stages:
        projection.apply(stage)
        entries = kept.located()
        events = list(kept.events(entries))
        times = sorted({logged.event.occurred_at for logged in events})
        moments = [times[0] - timedelta(seconds=1), *times, times[-1] + timedelta(seconds=1)]
        moments += [a + (b - a) / 2 for a, b in itertools.pairwise(times)]
        for moment in moments:
            folded = at_end.folded_at(kept, entries, moment)
            assert kept_cluster_at(kept, entries, moment, folded) == cluster_at(events, moment)
        assert len(at_end._snapshots) <= kept_at_most


def test_a_stored_document_is_counted_without_being_validated_again() -> None:
    """A spec stored under looser rules (a name today's rules refuse), or before a field existed,
    must not fail every read of its tenant's holdings; a node status no release knows is no
    present node."""
    charges = charges_on([node_doc("n0"), node_doc("n1"), node_doc("odd", status="SOMETHING-NEW")])
    older = job_doc("older", "a", 1, 32.0, "n0")
    older["spec"]["name"] = "Not A Valid Name Today!"
    del older["spec"]["placement"], older["spec"]["memory_mb"]
    assert counts_as_gpus(older, charges) == 4.0


def test_copies_are_kept_at_least_one_event_apart() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ClusterAtEnd(snapshot_every=0)


def test_the_kept_log_holds_where_each_event_is_not_the_event(tmp_path: Path) -> None:
    """Decoded, an event took about 2.9 KB, and the API kept every one: a log of a million events
    held 2.9 GB. What the kept log holds per event is measured (about 310 bytes here)."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    projection = Projection(tmp_path / "projection.sqlite")
    copies = 40
    projection.apply(
        [
            LoggedEvent(
                entry.event.model_copy(update={"event_id": uuid.uuid4(), "job_id": f"job-{copy}"}),
                copy,
                offset,
            )
            for copy in range(copies)
            for offset, entry in enumerate(read)
        ]
    )
    kept = KeptLog(projection)
    gc.collect()
    tracemalloc.start()
    try:
        entries = kept.located()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(entries) == copies * len(read)
    assert held / len(entries) < 500, f"{held / len(entries):.0f} bytes an event"


def test_a_projection_replaced_between_the_read_and_the_fold_is_read_afresh(tmp_path: Path) -> None:
    """A rebuilt file with more rows than were read passes for the one read: its rows would have
    been folded as the old file's events. Each row decoded is checked to be the event read, and
    the time machine reads the new file afresh."""
    first = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    second = list(read_log(GOLDEN_DIR / "node_drain.events.jsonl"))
    path = tmp_path / "projection.sqlite"
    projection = Projection(path)
    projection.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(first)])
    kept, at_end = KeptLog(projection), ClusterAtEnd()
    entries = list(kept.located())
    projection.close()
    for stale in tmp_path.glob("projection.sqlite*"):
        stale.unlink()
    rebuilt = Projection(path)  # other events, on another partition, and more of them
    more = [LoggedEvent(entry.event, 3, offset) for offset, entry in enumerate([*second, *first])]
    rebuilt.apply(more)
    rebuilt.close()

    with pytest.raises(store.KeptLogChanged):
        list(kept.events(entries))
    picture, _ = kept_picture(kept, at_end, None)

    assert picture == cluster_at(more, None)
    assert picture["applied"] == len(more)


def test_a_projection_replaced_by_one_whose_new_rows_sort_last_is_not_folded_on_as_the_old_one(
    tmp_path: Path,
) -> None:
    """Its rows past those read decoded as they are (positions and all) and sorted after every event
    kept: folded on, the picture was the old file's jobs with the new file's tail. The file's
    replica id tells them apart, and what was folded from the old one is dropped."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    path = tmp_path / "projection.sqlite"
    projection = Projection(path)
    projection.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(read[:5])])
    kept, at_end = KeptLog(projection), ClusterAtEnd()
    kept_picture(kept, at_end, None)
    projection.close()
    for stale in tmp_path.glob("projection.sqlite*"):
        stale.unlink()
    later = timedelta(days=1)
    other = [
        LoggedEvent(
            entry.event.model_copy(
                update={"job_id": "impostor", "occurred_at": entry.event.occurred_at + later}
            ),
            0,
            offset,
        )
        for offset, entry in enumerate(read)
    ]
    rebuilt = Projection(path)
    rebuilt.apply(other)
    rebuilt.close()

    picture, series = kept_picture(kept, at_end, None)

    assert [job["job_id"] for job in picture["jobs"]] == ["impostor"]
    assert picture == cluster_at(other, None)
    afresh = ClusterAtEnd()
    assert series == kept_picture(KeptLog(Projection(path)), afresh, None)[1]


def test_an_event_that_fails_to_decode_keeps_what_was_folded_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bad row made every later read fold the whole log again up to it, under the lock every
    tenant's time machine waits on; the fold keeps what it folded, and reads on from the bad row."""
    read = list(read_log(GOLDEN_DIR / "happy_path.events.jsonl"))
    projection = Projection(tmp_path / "projection.sqlite")
    projection.apply([LoggedEvent(entry.event, 0, offset) for offset, entry in enumerate(read)])
    kept, at_end = KeptLog(projection), ClusterAtEnd()
    bad = read[30].event.event_id
    decoded: list[bytes] = []
    real = store.trusted_any_event_from_json

    def failing(body: bytes) -> Any:
        decoded.append(body)
        if str(bad).encode() in body:
            raise ValueError("refused by today's rules")
        return real(body)

    monkeypatch.setattr(store, "trusted_any_event_from_json", failing)
    for _ in range(3):
        with pytest.raises(ValueError, match="today's rules"):
            at_end.folded(kept, kept.located())
    assert len(decoded) == 31 + 1 + 1, "the events before the bad one are decoded once"
