"""The time machine's picture of every job: each row tells why the job is in the state it was in then."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from ffdl.projections.store import LoggedEvent, Projection
from ffdl.projections.timemachine import cluster_at
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

    given_back = projection.logged_events()

    assert [(entry.partition, entry.offset) for entry in given_back] == [(2, n) for n in range(len(logged))]
    assert [entry.event.event_id for entry in given_back] == [entry.event.event_id for entry in logged]
    [job] = cluster_at(given_back, None)["jobs"]
    assert job["state"] == "COMPLETED"
