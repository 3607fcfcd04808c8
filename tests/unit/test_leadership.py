"""A term of leadership: served while the election names its token, cancelled once it does not."""

from __future__ import annotations

import asyncio

import pytest

from ffdl.handlers.leadership import lead

ROLE = "scheduler"


class ScriptedElection:
    """An election this test decides: ``elect`` names the next token, ``depose`` ends the term."""

    def __init__(self) -> None:
        self.elected: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.leading: int | None = None
        self.resigned = 0

    def elect(self, token: int) -> None:
        self.elected.set_result(token)

    def depose(self) -> None:
        self.leading = None

    async def campaign(self, role: str) -> int:
        self.leading = await self.elected
        return self.leading

    async def current_token(self, role: str) -> int | None:
        return self.leading

    async def is_leader(self, role: str, token: int) -> bool:
        return self.leading == token

    async def resign(self, role: str) -> None:
        self.resigned += 1
        self.leading = None

    async def close(self) -> None:
        return None


async def test_a_deposed_term_is_cancelled_at_once_and_resigned() -> None:
    election = ScriptedElection()
    served: list[int] = []
    serving, cancelled = asyncio.Event(), asyncio.Event()

    async def serve(token: int) -> None:
        served.append(token)
        serving.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    term = asyncio.create_task(lead(election, ROLE, serve, asyncio.Event(), check_every_s=0.01))
    election.elect(7)
    async with asyncio.timeout(5):
        await serving.wait()
    assert not term.done(), "the term is served while it leads"
    election.depose()
    async with asyncio.timeout(5):
        await term
    assert served == [7] and cancelled.is_set() and election.resigned == 1


async def test_a_failing_term_is_raised_after_resigning() -> None:
    election = ScriptedElection()
    election.elect(3)

    async def serve(token: int) -> None:
        raise RuntimeError(f"term {token} broke")

    with pytest.raises(RuntimeError, match="term 3 broke"):
        await lead(election, ROLE, serve, asyncio.Event(), check_every_s=0.01)
    assert election.resigned == 1


async def test_stopping_while_campaigning_serves_nothing() -> None:
    election = ScriptedElection()
    stop = asyncio.Event()

    async def serve(token: int) -> None:
        raise AssertionError("never elected")

    asyncio.get_running_loop().call_later(0.01, stop.set)
    async with asyncio.timeout(5):
        await lead(election, ROLE, serve, stop)
    assert election.resigned == 0 and election.elected.cancelled()
