"""The API decides with the clocks it is given: the learners' heartbeats it shows are one snapshot of
the store per ``max_age_s`` on its monotonic clock, and their progress ages are read on its wall clock."""

from __future__ import annotations

from pathlib import Path

from ffdl.adapters.heartbeats import open_store
from ffdl.api.heartbeats import HeartbeatView
from ffdl.handlers.heartbeat_keys import LearnerBeat, learner_key

EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z


async def test_heartbeats_are_one_snapshot_per_interval_aged_on_the_given_clocks(tmp_path: Path) -> None:
    store = open_store(f"embedded://{tmp_path / 'heartbeats.sqlite'}")
    monotonic, wall = [100.0], [EPOCH_S + 30.0]
    view = HeartbeatView(store, max_age_s=0.5, clock=lambda: monotonic[0], wall_clock=lambda: wall[0])
    try:
        await store.put(learner_key("job", 0), LearnerBeat(attempt=1, last_progress=EPOCH_S + 10.0).to_json())

        assert await view.of("job") == {0: {"alive": True, "attempt": 1, "last_progress_age_s": 20.0}}

        await store.put(learner_key("job", 1), LearnerBeat(attempt=1, last_progress=EPOCH_S + 25.0).to_json())
        monotonic[0] += 0.5
        assert set(await view.of("job")) == {0}, "the snapshot is reused for max_age_s"

        monotonic[0] += 0.01
        wall[0] += 5.0
        assert await view.of("job") == {
            0: {"alive": True, "attempt": 1, "last_progress_age_s": 25.0},
            1: {"alive": True, "attempt": 1, "last_progress_age_s": 10.0},
        }
    finally:
        await store.close()
