"""The program that starts an unsandboxed learner's command as the learner user (DESIGN §6a).

Where the platform runs as root with the sandbox off (``FFDL_SANDBOX=off``, the operator's choice)
and learners run as a learner user (``FFDL_LEARNER_USER``), the agent (root) starts the command as::

    /bin/sh -c <join the cgroup> ffdl-cgroup PROCS... -- \\
        PYTHON -I -S .../user_switch.py FD UID GID -- /bin/sh -c COMMAND

The shell that joins the learner's cgroup (:func:`~ffdl.adapters.launchers.cgroups.joining_command`,
where the learner has one) and this program run as root, so the shell can write ``cgroup.procs``,
and both start with the platform's ``PATH`` alone
(:func:`~ffdl.adapters.launchers.sandbox.setup_environment`), as the programs that make a sandbox
do: no variable of the job's is in the environment of a root-side program when the loader, the C
library or Python start it. This program, run with ``-I -S`` (no site, no user site, no
``PYTHON*`` variable, nothing of its working directory, which is the learner's) and importing only
the standard library, all of it before it switches (the interpreter's library may lie where the
learner user cannot read it, under ``/root``), then, still root:

1. reads the command's environment from descriptor ``FD`` (a sealed memory file:
   :func:`~ffdl.adapters.launchers.sandbox.environment_file`, the words bwrap reads with ``--args``,
   ``--clearenv`` then ``--setenv NAME VALUE`` per variable, so no value is on a command line) and
   closes it;
2. empties the capability bounding set (where it may: it needs ``CAP_SETPCAP``) and the ambient set;
3. drops every supplementary group and sets its real, effective and saved group and user ids to the
   learner's (the kernel clears the permitted, effective and ambient capabilities as the uid leaves
   0), clears the inheritable set and sets ``no_new_privs``: no set-uid program and no file
   capability elevates what it starts;
4. checks in ``/proc/self/status`` that it holds nothing of root (ids, groups, every capability
   set, ``NoNewPrivs``), and otherwise exits with status 125, as the joining shell does when it
   cannot join the cgroup;
5. restores the signals Python ignores (``SIGPIPE``, ``SIGXFSZ``) and executes the command with its
   environment, in the process the agent started (same pid, same process group: a stop reaches it).

As the learner user the command cannot write any ``cgroup.procs`` (root's, 0644), so it stays in
its cgroup, and it cannot regain root. The launcher runs an empty command through the switch once
at start (:func:`~ffdl.adapters.launchers.isolation.check_user_switch`) and refuses to start when
it cannot be made.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

#: The status the program exits with when it cannot switch (the joining shell's, when it cannot join).
CANNOT_SWITCH = 125
PROGRAM = "ffdl-user-switch"

_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_EPERM = 1
_EINVAL = 22


def switching_command(python: str, descriptor: int, uid: int, gid: int, command: Sequence[str]) -> list[str]:
    """``command`` started as ``uid``:``gid`` by this program, run with ``python``, with the
    environment read from ``descriptor`` (:func:`~ffdl.adapters.launchers.sandbox.environment_file`,
    which the caller passes to it). ``command[0]`` is an absolute path: nothing is looked up."""
    if not command or not os.path.isabs(command[0]):
        raise ValueError("the command to switch to is named by an absolute path")
    program = os.path.abspath(__file__)
    return [python, "-I", "-S", program, str(descriptor), str(uid), str(gid), "--", *command]


def read_environment(data: bytes) -> dict[bytes, bytes]:
    """The environment bwrap's ``--args`` words in ``data`` give (``--clearenv``, then ``--setenv
    NAME VALUE`` per variable, each word ended by a NUL); ValueError for anything else."""
    words = data.split(b"\0")
    if words[:1] != [b"--clearenv"] or words[-1] != b"" or (len(words) - 2) % 3:
        raise ValueError("not --clearenv and --setenv NAME VALUE words, each ended by a NUL")
    environment: dict[bytes, bytes] = {}
    for index in range(1, len(words) - 1, 3):
        option, name, value = words[index : index + 3]
        if option != b"--setenv" or not name or b"=" in name:
            raise ValueError("a word is not --setenv NAME VALUE with a name holding no '='")
        environment[name] = value
    return environment


def still_held(status: str, uid: int, gid: int, bounding_set_emptied: bool) -> list[str]:
    """What of root a process whose ``/proc/<pid>/status`` is ``status`` still holds, as the learner
    ``uid``:``gid``: ids other than the learner's, a group, a capability, no ``no_new_privs``."""
    fields = {name: value.split() for name, _, value in (line.partition(":") for line in status.splitlines())}
    held = []
    if fields.get("Uid") != [str(uid)] * 4:
        held.append(f"uids {fields.get('Uid')}")
    if fields.get("Gid") != [str(gid)] * 4:
        held.append(f"gids {fields.get('Gid')}")
    if fields.get("Groups", []):
        held.append(f"groups {fields['Groups']}")
    capability_sets = ["CapInh", "CapPrm", "CapEff", "CapAmb"] + (["CapBnd"] if bounding_set_emptied else [])
    for name in capability_sets:
        value = fields.get(name, ["?"])
        if len(value) != 1 or set(value[0]) != {"0"}:
            held.append(f"{name} {value}")
    if fields.get("NoNewPrivs") != ["1"]:
        held.append(f"NoNewPrivs {fields.get('NoNewPrivs')}")
    return held


class _CapabilityHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapabilityData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _prctl(libc: ctypes.CDLL, option: int, argument: int, third: int = 0) -> int:
    """prctl's result: 0, or the errno it failed with."""
    if libc.prctl(ctypes.c_int(option), ctypes.c_ulong(argument), ctypes.c_ulong(third), 0, 0) == 0:
        return 0
    return ctypes.get_errno()


def _empty_bounding_set(libc: ctypes.CDLL) -> bool:
    """Drop every capability from the bounding set; False where this process may not (no
    ``CAP_SETPCAP``): the learner then gains none through it either, with ``no_new_privs``."""
    capability = 0
    while (failed := _prctl(libc, _PR_CAPBSET_DROP, capability)) == 0:
        capability += 1
    if failed == _EPERM and capability == 0:
        return False
    if failed != _EINVAL:  # past the last capability this kernel knows
        raise OSError(failed, f"dropping capability {capability} from the bounding set")
    return True


def _switch(uid: int, gid: int) -> bool:
    """Become ``uid``:``gid`` for good, holding no capability, with ``no_new_privs``; whether the
    bounding set was emptied."""
    libc = ctypes.CDLL(None, use_errno=True)
    emptied = _empty_bounding_set(libc)
    if (failed := _prctl(libc, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)) not in (0, _EINVAL):
        raise OSError(failed, "clearing the ambient capabilities")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    header = _CapabilityHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    nothing = (_CapabilityData * 2)()
    if libc.capset(ctypes.byref(header), nothing) != 0:
        raise OSError(ctypes.get_errno(), "clearing the capability sets")
    if (failed := _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)) != 0:
        raise OSError(failed, "setting no_new_privs")
    return emptied


def _read_all(descriptor: int) -> bytes:
    chunks = []
    while chunk := os.read(descriptor, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def main(argv: Sequence[str]) -> int:
    """``user_switch.py FD UID GID -- COMMAND...``: see the module docstring. Returns only on failure."""
    words = list(argv)
    try:
        separator = words.index("--")
        descriptor, uid, gid = (int(word) for word in words[:separator])
        command = words[separator + 1 :]
        if uid <= 0 or gid <= 0 or not command:
            raise ValueError("a uid and a gid other than root's, and a command")
    except ValueError as error:
        print(f"{PROGRAM}: usage: FD UID GID -- COMMAND...: {error}", file=sys.stderr)
        return CANNOT_SWITCH
    try:
        try:
            environment = read_environment(_read_all(descriptor))
        finally:
            os.close(descriptor)
        emptied = _switch(uid, gid)
        # nothing is imported from here on: the interpreter's library may be closed to the learner
        with open("/proc/self/status", "rb") as status:
            held = still_held(status.read().decode("ascii", "replace"), uid, gid, emptied)
    except Exception as error:  # whatever it is, the command does not run
        print(f"{PROGRAM}: cannot run the command as {uid}:{gid}: {error}", file=sys.stderr)
        return CANNOT_SWITCH
    if held:
        print(f"{PROGRAM}: the command would hold {', '.join(held)}: not run", file=sys.stderr)
        return CANNOT_SWITCH
    for ignored in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(ignored, signal.SIG_DFL)
    try:
        os.execve(command[0], command, environment)
    except OSError as error:
        print(f"{PROGRAM}: {command[0]}: {error.strerror}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126
    return CANNOT_SWITCH  # not reached: execve returns only by raising


__all__ = ["CANNOT_SWITCH", "PROGRAM", "read_environment", "still_held", "switching_command"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
