"""Child processes as the local launcher and the learner agent run them: exit codes and waiting."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess


def exit_code_of(returncode: int) -> int:
    """The learner's exit code: negative for death by signal, as Python's ``returncode`` has it.

    The shell reports a command killed by signal N as status 128 + N; that is translated too (a
    program that exits with 137 on its own is indistinguishable from one killed by SIGKILL, to the
    agent as to anyone reading ``$?``).
    """
    if 128 < returncode < 128 + signal.NSIG:
        return -(returncode - 128)
    return returncode


async def wait_for_exit(process: subprocess.Popen[bytes]) -> int:
    """Wait for a child process to exit (on a pidfd: no polling, no thread), reap it, return its status.

    ``asyncio``'s own ``Process.wait`` also waits for the child's pipes to close, which a daemon the
    child left behind may never do; this waits for the process alone.
    """
    if process.poll() is not None:
        return process.returncode
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    pidfd = os.pidfd_open(process.pid)
    try:
        loop.add_reader(pidfd, on_exit)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    return process.wait()
