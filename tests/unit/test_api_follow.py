"""Following a job's events (api.routes.events.follow_events): the stream ends with the job, never
before its last events, whatever the projector applies while the follower writes."""

from __future__ import annotations

from typing import Any

from ffdl.api.routes.events import follow_events


class _Request:
    async def is_disconnected(self) -> bool:
        return False


class _Progress:
    def version(self) -> int:
        return 0

    async def wait_for_change(self, version: int, timeout_s: float) -> None:
        return None


class _Projection:
    """A job of 13 events: 11 projected when the follower first reads, the last 2 (the job ends and
    its GPUs are released) projected while it writes those out."""

    def __init__(self) -> None:
        self.projected = 11

    def history(self, kind: object, job_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        return [{"seq": seq, "type": f"E{seq}"} for seq in range(after_seq + 1, self.projected + 1)][:limit]

    def get(self, job_id: str) -> dict[str, Any]:
        if self.projected == 13:
            return {"state": "COMPLETED", "placement": None}
        return {"state": "RUNNING", "placement": {"learners": []}}


class _Backend:
    def __init__(self) -> None:
        self.progress = _Progress()
        self.projection = _Projection()

    async def redacted(self, caller: object, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.projection.projected = 13  # the projector runs while the follower awaits
        return batch


async def test_a_follower_gets_the_events_projected_while_it_wrote_before_the_stream_ends() -> None:
    """The stream read the job's events, wrote them (awaiting), then read whether the job had ended:
    it had, meanwhile, and the stream ended without its last two events."""
    stream = follow_events(_Request(), _Backend(), object(), "job-1", 0)  # type: ignore[arg-type]
    seen = [chunk async for chunk in stream if chunk.startswith(b"id: ")]
    assert [int(chunk.split(b"\n")[0][4:]) for chunk in seen] == list(range(1, 14))
