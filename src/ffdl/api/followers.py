"""Long-lived streams (a job's events followed as SSE, a learner's log followed), bounded in number.

Each open stream holds a request, a connection and a reader of the projection or a file, so their
number is capped in all and per tenant: one tenant's followers cannot take every slot. Over a cap
the request answers 429 with ``Retry-After``. A stream holds its slot from the moment it is
admitted until its response ends, however it ends (finished, client gone, never started).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterable, Callable, Mapping

from fastapi import HTTPException
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

#: Seconds a refused follower is asked to wait before trying again.
RETRY_AFTER_S = 5
#: Seconds an open stream waits for the projection to change before it sends a keep-alive (which is
#: how it notices a client gone) and looks again.
KEEP_ALIVE_S = 1.0


class Followers:
    """The open streams, counted in all and per tenant, each under its cap."""

    def __init__(self, total: int, per_tenant: int) -> None:
        self._total = total
        self._per_tenant = per_tenant
        self._open: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return self._open.total()

    def admit(self, tenant: str) -> None:
        """Take a slot for one of ``tenant``'s streams, or refuse with 429 if a cap is reached."""
        if self._open[tenant] >= self._per_tenant:
            raise too_many(f"{self._per_tenant} streams of tenant {tenant} are open already")
        if self.open >= self._total:
            raise too_many(f"{self._total} streams are open already")
        self._open[tenant] += 1

    def release(self, tenant: str) -> None:
        self._open[tenant] -= 1
        if self._open[tenant] <= 0:
            del self._open[tenant]

    def stream(
        self,
        tenant: str,
        content: AsyncIterable[bytes],
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> StreamingResponse:
        """A streaming response holding one of ``tenant``'s slots (admit first) until it ends."""
        return _HeldStream(
            content, media_type=media_type, headers=headers, release=lambda: self.release(tenant)
        )


def too_many(message: str) -> HTTPException:
    return HTTPException(
        429,
        detail=[{"field": "follow", "message": f"{message}; try again later"}],
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class _HeldStream(StreamingResponse):
    """A streaming response that releases its slot when it ends, whether or not it ever started."""

    def __init__(
        self,
        content: AsyncIterable[bytes],
        *,
        media_type: str,
        headers: Mapping[str, str] | None,
        release: Callable[[], None],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
