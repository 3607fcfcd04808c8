"""A singleton role's term of leadership: campaign, serve while leading, stop at once when deposed.

A role that must run once in the whole platform (the scheduler) runs as the leader of an election.
Its work is fenced by the term's token, and the jobs' owners refuse commands of an old token; but a
deposed leader should also stop *sending* them at once. So the term's work runs as a task that is
cancelled as soon as the election no longer names this term's token: leadership is checked every
``check_every_s``, well within the election's lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from ffdl.handlers.aio import until_stopped
from ffdl.handlers.ports import Election

log = structlog.get_logger(__name__)

#: How often a leader checks that it still leads.
LEADERSHIP_CHECK_S = 0.25


async def lead(
    election: Election,
    role: str,
    serve: Callable[[int], Awaitable[None]],
    stop: asyncio.Event,
    *,
    check_every_s: float = LEADERSHIP_CHECK_S,
) -> None:
    """One term: campaign for ``role`` until elected or ``stop``, then ``serve(token)`` until it
    ends or this process is deposed, then resign.

    A failure of ``serve`` is raised once the term is over (its supervisor runs the next term); a
    term that ends any other way returns, and the caller campaigns again if it is still running.
    """
    token = await until_stopped(election.campaign(role), stop)
    if token is None:
        return
    log.info("leading", role=role, fencing_token=token)
    term = asyncio.ensure_future(serve(token))
    try:
        while not term.done():
            await asyncio.wait({term}, timeout=check_every_s)
            if not term.done() and not await election.is_leader(role, token):
                log.warning("deposed: the term's work stops", role=role, fencing_token=token)
                break
    finally:
        term.cancel()
        await asyncio.gather(term, return_exceptions=True)
        await election.resign(role)
    if not term.cancelled() and (error := term.exception()) is not None:
        raise error
