"""A user's mistake never shows a traceback: every command of ``ffdl``, given bad input (a missing
file, a malformed argument, an API that is not there), answers with ``error:`` lines and a non-zero
exit.

The commands are read from the CLI itself, so a new command without a bad input here fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from ffdl.cli.main import app

#: An address where no API listens (port 9 is discard; nothing of ours binds it).
NOWHERE = "http://127.0.0.1:9"

#: Per command path, invocations with bad input. ``{missing}`` is a file that does not exist,
#: ``{bad_yaml}`` a manifest that is no YAML, ``{junk}`` a log that is no log.
MISTAKES: dict[str, list[list[str]]] = {
    "up": [["--roles", "nonsense"]],
    "demo": [["--steps", "-5"], ["--linger", "-1"]],
    "simulate": [[], ["{missing}"], ["{junk}"], ["--policy", "sideways", "{junk}"], ["--generate", "3"]],
    "submit": [[], ["{missing}"], ["{bad_yaml}"], ["{directory}"]],
    "status": [[], ["some-job"], ["some-job", "-o", "toml"], ["some-job", "--json", "-o", "yaml"]],
    "list": [["--limit", "0"], ["--label", "team"], ["-o", "csv"], []],
    "halt": [[], ["some-job"]],
    "resume": [["some-job"]],
    "cancel": [["some-job"]],
    "delete": [[], ["some-job", "--yes"]],
    "events": [["some-job"], ["some-job", "--follow"]],
    "why": [["some-job"]],
    "logs": [["some-job"], ["some-job", "-f"], ["some-job", "--rank", "-1"], ["some-job", "--attempt", "0"]],
    "export": [["--type", "NoSuchEvent"], ["--since", "yesterday-ish"], ["--bus", "carrier-pigeon://x"]],
    "import": [["{missing}"], ["{junk}"]],
    "replay": [[], ["{missing}", "--rebuild"], ["{junk}", "--job", "x"], ["--cluster", "--at", "noon-ish"]],
    "verify": [["{missing}"], ["{junk}"], ["--redecide", "{missing}"]],
    "tenants add": [["Not A Name!"], []],
    "tenants list": [["--no-such-flag"]],
    "tenants set": [["no-such-tenant", "--max-priority", "5"], ["acme", "--max-priority", "5000"], ["acme"]],
    "nodes list": [[], ["-o", "csv"]],
    "nodes show": [["node-z"]],
    "nodes cordon": [["node-z"], ["node-z", "--reason", "fan"]],
    "nodes drain": [["node-z", "--reason", "fan"]],
    "nodes uncordon": [["node-z"]],
}


def command_paths(group: Any, prefix: str = "") -> list[str]:
    """Every command's path under ``group`` (a click group as typer builds it: typer may carry its own)."""
    paths = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(command, "commands"):
            paths += command_paths(command, f"{path} ")
        else:
            paths.append(path)
    return paths


def test_every_command_has_bad_input_here() -> None:
    assert sorted(command_paths(typer.main.get_command(app))) == sorted(MISTAKES)


@pytest.mark.parametrize(
    ("path", "args"), [(path, args) for path, cases in MISTAKES.items() for args in cases], ids=str
)
def test_a_mistake_is_an_error_line_and_a_non_zero_exit(
    path: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        "{missing}": str(tmp_path / "no-such-file.yaml"),
        "{bad_yaml}": str(tmp_path / "bad.yaml"),
        "{junk}": str(tmp_path / "junk.jsonl"),
        "{directory}": str(tmp_path),
    }
    Path(files["{bad_yaml}"]).write_text("name: x\nlearners: [1\n")
    Path(files["{junk}"]).write_text("this is not\n{ a log\n")
    monkeypatch.chdir(tmp_path)
    env = {
        "FFDL_API": NOWHERE,
        "FFDL_DATA_DIR": str(tmp_path / "data"),
        "FFDL_TENANTS_FILE": str(tmp_path / "tenants.json"),
    }
    argv = [*path.split(), *(files.get(arg, arg) for arg in args)]
    result = CliRunner().invoke(app, argv, env=env, input="n\n")
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines, "a mistake must say what it was"
    said = ("error:", "Usage:")  # ours, or click's for a malformed command line
    assert any(line.startswith(said) for line in lines), result.output


def test_the_words_of_an_unreachable_api_and_of_a_missing_file(tmp_path: Path) -> None:
    runner = CliRunner()
    unreachable = runner.invoke(app, ["list"], env={"FFDL_API": NOWHERE})
    assert (unreachable.exit_code, unreachable.output) == (
        2,
        f"error: cannot reach the API at {NOWHERE}: is `ffdl up` running? (FFDL_API)\n",
    )
    missing = tmp_path / "manifest.yaml"
    answer = runner.invoke(app, ["submit", str(missing)], env={"FFDL_API": NOWHERE})
    assert (answer.exit_code, answer.output) == (2, f"error: {missing}: No such file or directory\n")


@pytest.mark.parametrize("path", sorted(MISTAKES))
def test_help_texts_speak_to_users_not_to_the_design_notes(path: str) -> None:
    """A command's help names no section of the design notes ("architecture §5"): its reader is a user."""
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "§" not in result.output and "architecture" not in result.output.lower()
