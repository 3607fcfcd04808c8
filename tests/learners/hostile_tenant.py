"""A hostile tenant's training program: each mode is one line of attack on the platform or on another
job, run as a job on the local launcher. It prints ``tried NAME: got it`` or ``tried NAME: refused``
for each try, so that the test reads what worked, and ends with ``done``.

plant     write modules and startup files the agent would import where the learner can write, and
          fail the first attempt (so a second agent starts over them)
probe     reach the platform's files, another job (VICTIM_DIR) and its report socket, the host's sysctls,
          processes and /tmp; the host's loopback (HOST_PORT, the API's API_PORT), an abstract unix
          socket of the host (ABSTRACT_NAME) and the host's sockets in /proc/net; leave a process
          behind with ``setsid`` (its argument: SLEEP_MARK)
flood     send the agent an endless line, a report of 40,000 metrics, NaN, a flood of junk and a
          stalled half line; report checkpoints outside the checkpoint directory; then report step 7
memory    allocate far more than the manifest's memory_mb
setuid    leave a set-uid copy of a program in its working directory, opened to everyone (the
          learner's uid is root outside: the file is root's on the host)
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ffdl import learner


def attempt(name: str, action: Callable[[], object]) -> None:
    try:
        action()
    except (OSError, subprocess.CalledProcessError):
        print(f"tried {name}: refused", flush=True)
    else:
        print(f"tried {name}: got it", flush=True)


def plant() -> int:
    marker = os.environ["MARKER"]
    payload = f"import pathlib\npathlib.Path({marker!r}).write_text('imported by ' + __name__)\n"
    places = {Path.cwd(), Path.home(), Path(os.environ["FFDL_CHECKPOINT_DIR"])}
    for place in places:
        for module in ("structlog", "msgspec", "sitecustomize", "usercustomize", "ffdl"):
            (place / f"{module}.py").write_text(payload)
    print(f"planted in {sorted(map(str, places))}", flush=True)
    return 3 if os.environ["FFDL_ATTEMPT"] == "1" else 0


def connect_and_send(path: str, line: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(2)
        connection.connect(path)
        connection.sendall(line)


def probe() -> int:
    data = Path(os.environ["TARGET_DATA_DIR"])
    victim = Path(os.environ["VICTIM_DIR"])
    forged = (
        json.dumps({"type": "progress", "step": 424242, "metrics": {"pwned_by_hostile": 1}}).encode() + b"\n"
    )
    attempt("read tenants.json", (data / "tenants.json").read_bytes)
    attempt("list the data dir", lambda: os.listdir(data))
    attempt("list the victim's job dir", lambda: os.listdir(victim))
    attempt("write the victim's checkpoints", lambda: (victim / "checkpoints" / "planted").write_text("x"))
    # root outside, the learner's uid passes a sysctl's mode check: kernel.core_pattern names a program
    # the kernel runs as root on the host (opened only: nothing is written)
    attempt(
        "open a host sysctl for writing",
        lambda: os.close(os.open("/proc/sys/kernel/core_pattern", os.O_WRONLY)),
    )
    attempt("read the victim's log", (victim / "logs" / "attempt-1" / "learner-0.log").read_bytes)

    def forge_reports() -> None:
        sockets = glob.glob(f"{victim.parent}/*/channels/*/report.sock")
        sockets.append(str(victim / "channels" / "attempt-1-rank-0" / "report.sock"))
        for path in sockets:
            if path != os.environ["FFDL_REPORT_SOCKET"]:
                connect_and_send(path, forged)

    attempt("forge the victim's reports", forge_reports)

    def other_processes() -> None:
        mine = {os.getpid(), os.getppid()}
        pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        others = [pid for pid in pids - mine if pid != 1 and "hostile_tenant" not in _cmdline(pid)]
        others = [pid for pid in others if _cmdline(pid) and "sleep" not in _cmdline(pid)]
        if others:
            print(f"sees {[_cmdline(pid)[:60] for pid in others]}", flush=True)
            return
        raise OSError("no other process")

    def reach(port: int) -> None:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()

    def abstract_socket() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(2)
            connection.connect("\0" + os.environ["ABSTRACT_NAME"])

    def host_sockets() -> None:
        listed = Path("/proc/net/tcp").read_text() + Path("/proc/net/unix").read_text()
        if (
            f":{int(os.environ['HOST_PORT']):04X} " not in listed
            and os.environ["ABSTRACT_NAME"] not in listed
        ):
            raise OSError("none of the host's sockets is listed")

    attempt("reach a port of the host's loopback", lambda: reach(int(os.environ["HOST_PORT"])))
    attempt("reach the platform's API", lambda: reach(int(os.environ["API_PORT"])))
    attempt("connect to an abstract socket of the host", abstract_socket)
    attempt("see the host's sockets", host_sockets)

    marker = Path("/tmp") / os.environ["TMP_MARK"]
    marker.write_text("left in /tmp")
    subprocess.Popen(["setsid", "sh", "-c", f"sleep {os.environ['SLEEP_MARK']} & sleep 0.01"]).wait()
    attempt("see other processes", other_processes)
    learner.report_progress(1)
    print("done", flush=True)
    return 0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def flood() -> int:
    target = os.environ["FFDL_REPORT_SOCKET"]
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(target)
    stalled.sendall(b'{"type": "progress", "step": 99999, "metr')  # and never the rest
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as endless:
        endless.connect(target)
        endless.sendall(b'{"type": "progress", "step": 88888, "metrics": {"x": "' + b"y" * (8 << 20))
    huge = {f"metric_{index}": float(index) for index in range(40_000)}
    connect_and_send(target, json.dumps({"type": "progress", "step": 2, "metrics": huge}).encode() + b"\n")
    connect_and_send(target, b'{"type": "progress", "step": 3, "metrics": {"loss": NaN, "ok": 1.5}}\n')
    try:
        connect_and_send(target, b"junk\n" * 200_000)
    except OSError as error:  # the agent closes a connection that sends that much garbage
        print(f"junk cut off: {error}", flush=True)
    evil = Path("/tmp/evil-ckpt.pt")
    evil.write_bytes(b"not a checkpoint")
    learner.report_checkpoint(evil, 4)
    checkpoints = learner.checkpoint_dir()
    (checkpoints / "escape").symlink_to("/etc")
    through_link = {"type": "checkpoint", "step": 5, "uri": f"file://{checkpoints.resolve()}/escape/passwd"}
    connect_and_send(target, json.dumps(through_link).encode() + b"\n")  # the helper would resolve it
    (checkpoints / "step-6.pt").write_bytes(b"weights")
    learner.report_checkpoint(checkpoints / "step-6.pt", 6)
    learner.report_progress(7, loss=0.5)
    time.sleep(0.5)
    print("done", flush=True)
    return 0


def memory() -> int:
    hog = b"x" * (int(os.environ["HOG_MB"]) << 20)  # written, so every page counts
    print(f"allocated {len(hog) >> 20} MB", flush=True)
    return 0


def setuid() -> int:
    planted = Path.cwd() / "rootenv"
    planted.write_bytes(Path("/usr/bin/env").read_bytes())
    planted.chmod(0o4755)
    Path.cwd().chmod(0o755)
    print(f"planted {planted} {oct(planted.stat().st_mode)}", flush=True)
    return 0


if __name__ == "__main__":
    modes = {"plant": plant, "probe": probe, "flood": flood, "memory": memory, "setuid": setuid}
    sys.exit(modes[sys.argv[1]]())
