"""The user switch: how an unsandboxed learner's command starts as the learner user, from root.

The program runs as root with the platform's PATH alone, reads the command's environment from a
descriptor, and gives up every id, group and capability for good before it runs the command.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from ffdl.adapters.launchers.isolation import LearnersCannotRun, LearnerUser, check_user_switch, learner_user
from ffdl.adapters.launchers.sandbox import environment_arguments, environment_file
from ffdl.adapters.launchers.user_switch import (
    CANNOT_SWITCH,
    read_environment,
    still_held,
    switching_command,
)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root switches users")
NOBODY = pwd.getpwnam("nobody")
SWITCHED = """Name:\tsh
Uid:\t65534\t65534\t65534\t65534
Gid:\t65534\t65534\t65534\t65534
Groups:\t
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t0000000000000000
CapBnd:\t0000000000000000
CapAmb:\t0000000000000000
NoNewPrivs:\t1
"""


def test_the_environment_is_read_as_bwrap_reads_it_and_nothing_else_is_taken() -> None:
    environment = {"PATH": "/usr/bin", "SECRET": "a b\nc = \u00e9", "EMPTY": "", "OPTION": "--setenv"}

    read = read_environment(environment_arguments(environment))

    assert read == {os.fsencode(name): os.fsencode(value) for name, value in environment.items()}
    assert read_environment(b"--clearenv\0") == {}
    for broken in (
        b"",
        b"--clearenv",
        b"--setenv\0A\0b\0",
        b"--clearenv\0--setenv\0A\0",
        b"--clearenv\0--x\0A\0b\0",
    ):
        with pytest.raises(ValueError):
            read_environment(broken)
    with pytest.raises(ValueError, match="'='"):
        read_environment(b"--clearenv\0--setenv\0A=B\0c\0")


def test_a_process_holds_nothing_of_root_with_the_learners_ids_no_group_or_capability_and_no_new_privs() -> (
    None
):
    assert still_held(SWITCHED, 65534, 65534, bounding_set_emptied=True) == []
    assert still_held(SWITCHED.replace("\t65534\n", "\t0\n", 1), 65534, 65534, True) == [
        "uids ['65534', '65534', '65534', '0']"
    ]
    assert still_held(SWITCHED.replace("Groups:\t", "Groups:\t0"), 65534, 65534, True) == ["groups ['0']"]
    assert still_held(
        SWITCHED.replace("CapPrm:\t0000000000000000", "CapPrm:\t0000000000000400"), 65534, 65534, True
    ) == ["CapPrm ['0000000000000400']"]
    assert still_held(SWITCHED.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0"), 65534, 65534, True) == [
        "NoNewPrivs ['0']"
    ]
    full_bounding = SWITCHED.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff")
    assert still_held(full_bounding, 65534, 65534, bounding_set_emptied=False) == []
    assert still_held(full_bounding, 65534, 65534, bounding_set_emptied=True) == [
        "CapBnd ['000001ffffffffff']"
    ]
    assert still_held("", 65534, 65534, True)  # nothing read is not nothing held


def test_the_switch_starts_a_command_named_by_its_path_with_this_program_isolated() -> None:
    command = switching_command("/usr/bin/python3", 7, 65534, 65533, ["/bin/sh", "-c", "true"])

    assert command[:3] == ["/usr/bin/python3", "-I", "-S"]
    assert command[3].endswith("/ffdl/adapters/launchers/user_switch.py") and os.path.isabs(command[3])
    assert command[4:] == ["7", "65534", "65533", "--", "/bin/sh", "-c", "true"]
    with pytest.raises(ValueError, match="absolute"):
        switching_command("/usr/bin/python3", 7, 65534, 65533, ["sh", "-c", "true"])


def switch(
    uid: int, gid: int, command: list[str], environment: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` through the switch as root would, with only PATH of its own."""
    given = environment_file(environment)
    try:
        return subprocess.run(
            switching_command(sys.executable, given, uid, gid, command),
            env={"PATH": os.defpath},
            pass_fds=[given],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(given)


@as_root
def test_the_command_runs_as_the_learner_user_holding_nothing_of_root_with_exactly_its_environment() -> None:
    environment = {"PATH": "/usr/bin:/bin", "SECRET": "a b\nc = \u00e9", "MALLOC_PERTURB_": "85"}
    command = [
        "/bin/sh",
        "-c",
        "cat /proc/$$/status; echo ---; cat /proc/$$/environ; echo; echo ---; yes | head -n 1",
    ]

    ran = switch(NOBODY.pw_uid, NOBODY.pw_gid, command, environment)

    assert ran.returncode == 0, ran.stderr
    status, environ, piped = ran.stdout.split("\n---\n")
    assert still_held(status, NOBODY.pw_uid, NOBODY.pw_gid, bounding_set_emptied=True) == []
    assert dict(entry.split("=", 1) for entry in environ.strip("\n").split("\0") if entry) == environment
    assert piped == "y\n"  # SIGPIPE is the command's default again (Python ignores it)


@as_root
def test_nothing_runs_when_the_switch_cannot_be_made() -> None:
    marker = ["/bin/sh", "-c", "echo ran"]

    for uid, gid in ((0, 0), (NOBODY.pw_uid, -1), (NOBODY.pw_uid, 0)):  # gid 0 is root's group
        refused = switch(uid, gid, marker, {})
        assert (refused.returncode, refused.stdout) == (CANNOT_SWITCH, ""), refused.stderr
        assert "usage" in refused.stderr

    given = os.memfd_create("not-an-environment")
    os.write(given, b"SECRET=x\0")
    os.lseek(given, 0, os.SEEK_SET)
    try:
        refused = subprocess.run(
            switching_command(sys.executable, given, NOBODY.pw_uid, NOBODY.pw_gid, marker),
            pass_fds=[given],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(given)
    assert (refused.returncode, refused.stdout) == (CANNOT_SWITCH, "")
    assert "--clearenv" in refused.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="a platform that is not root")
def test_a_platform_that_is_not_root_runs_nothing_through_the_switch() -> None:
    refused = switch(65533, 65533, ["/bin/sh", "-c", "echo ran"], {"PATH": "/usr/bin:/bin"})

    assert (refused.returncode, refused.stdout) == (CANNOT_SWITCH, "")


@as_root
def test_the_launcher_refuses_to_start_when_it_cannot_switch_to_the_learner_user(tmp_path: Path) -> None:
    learner = LearnerUser("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    check_user_switch(learner, sys.executable)  # an empty command runs as the learner user: fine

    with pytest.raises(LearnersCannotRun, match=r"cannot be started as the learner user root here: .*usage"):
        check_user_switch(LearnerUser("root", 0, 0), sys.executable)
    with pytest.raises(LearnersCannotRun, match="no-such-python"):
        check_user_switch(learner, str(tmp_path / "no-such-python"))


@as_root
def test_a_learner_user_in_roots_group_is_refused() -> None:
    """``FFDL_LEARNER_USER=1000:0`` ran learners as gid 0, root's group: they held an id of root's."""
    for spec in ("4242:0", "nobody:0"):
        with pytest.raises(ValueError, match="root's group"):
            learner_user(spec)
    assert learner_user("4242:4243") == LearnerUser("4242", 4242, 4243)
