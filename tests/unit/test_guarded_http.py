"""The API server's HTTP protocol closes connections that never finish their request headers, and
keeps no more open than its cap, with either of uvicorn's parsers, on real sockets.

uvicorn alone keeps a connection that sent part of its headers open forever (its keep-alive timer
runs only between requests): each of these tests fails with uvicorn's own protocol.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
import uvicorn

from ffdl.cli.guarded_http import guarded_protocol
from tests.services import wait_until_async

HEADER_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 8


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=["auto", "h11"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, int]]:
    parser: Literal["auto", "h11"] = request.param
    listening = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        hello,
        http=guarded_protocol(HEADER_TIMEOUT_S, MAX_CONNECTIONS, parser=parser),
        log_level="warning",
        lifespan="off",
    )
    running = uvicorn.Server(config)
    serving = asyncio.create_task(running.serve(sockets=[listening]))
    await wait_until_async(lambda: running.started, 10, what="the server serving")
    yield listening.getsockname()[:2]
    running.should_exit = True
    await serving


async def open_with(
    address: tuple[str, int], sent: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(sent)
    await writer.drain()
    return reader, writer


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What the server sent before it closed the connection, or None if it kept it open."""
    try:
        return await asyncio.wait_for(reader.read(), seconds)
    except TimeoutError:
        return None
    except ConnectionError:
        return b""


async def get(address: tuple[str, int]) -> bytes:
    reader, writer = await open_with(address, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_half_sent_headers_and_silent_connections_are_closed(server: tuple[str, int]) -> None:
    half = [await open_with(server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(3)]
    silent = await open_with(server, b"")
    closed = await asyncio.gather(*(closed_within(r, HEADER_TIMEOUT_S * 6) for r, _ in [*half, silent]))
    assert closed == [b""] * 4, closed
    for _, writer in [*half, silent]:
        writer.close()
    assert (await get(server)).startswith(b"HTTP/1.1 200")


async def test_the_deadline_holds_for_the_next_request_on_a_kept_connection(server: tuple[str, int]) -> None:
    reader, writer = await open_with(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    writer.write(b"GET / HTTP/1.1\r\nHo")  # the next request, never finished
    await writer.drain()
    assert await closed_within(reader, HEADER_TIMEOUT_S * 6) == b""
    writer.close()


async def test_a_slow_but_whole_request_is_answered(server: tuple[str, int]) -> None:
    reader, writer = await open_with(server, b"GET / HTTP/1.1\r\n")
    await asyncio.sleep(HEADER_TIMEOUT_S / 3)
    writer.write(b"Host: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_connections_past_the_cap_are_closed_at_once(server: tuple[str, int]) -> None:
    held = [await open_with(server, b"GET / HTTP/1.1\r\n") for _ in range(MAX_CONNECTIONS)]
    extra_reader, extra_writer = await open_with(server, b"")
    assert await closed_within(extra_reader, HEADER_TIMEOUT_S / 2) == b"", "kept past the cap"
    extra_writer.close()
    for _, writer in held:
        writer.close()

    async def served() -> bool:  # once the server has seen them go
        return (await get(server)).startswith(b"HTTP/1.1 200")

    await wait_until_async(served, 5, what="a connection under the cap served")
