"""The time machine's picture of every job: each row tells why the job is in the state it was in then."""

from __future__ import annotations

from datetime import datetime

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
