"""What the CLI shows of text others wrote (a tenant's reasons, labels, metric names and output, a
trace's names): never an escape sequence for the operator's terminal, never markup that Rich acts on."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from ffdl.cli.commands import jobs as job_commands
from ffdl.cli.render import job_table, learners_table, timeline_table
from ffdl.tools.terminal import shown, visible

#: A clipboard write (OSC 52), a cursor up and an erased line, a title, a link whose text lies, a
#: C1 control sequence introducer, and a lone closing tag.
HOSTILE = "\x1b]52;c;cm0gLXJm\x1b\\\x1b[1A\x1b[2K\x1b]0;TITLE\x07[link=https://evil.example]x[/link]\x9b[/]"


def printed(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=400, color_system=None).print(renderable)
    return out.getvalue()


def job_document() -> dict[str, Any]:
    return {
        "job_id": "job-1",
        "state": "FAILED",
        "tenant": "acme",
        "spec": {"learners": 1, "gpus": 1},
        "submitted_at": "2026-12-06T10:00:00+00:00",
        "reason": HOSTILE,
        "attempt": 1,
        "restarts": 0,
        "placement": None,
        "history": [{"seq": 1, "state": "FAILED", "at": "2026-12-06T10:00:00+00:00", "reason": HOSTILE}],
        "learners": [
            {
                "rank": 0,
                "status": "exited",
                "node": "n0",
                "gpus": [0],
                "step": 1,
                "metrics": {HOSTILE: 1.0},
                "exit_code": 1,
                "host": HOSTILE,
                "pid": 7,
                "last_progress_at": None,
            }
        ],
    }


@pytest.mark.parametrize(
    "table",
    [
        lambda job: job_table([job], wide=True),
        lambda job: learners_table(job, wide=True),
        timeline_table,
    ],
    ids=["list", "learners", "timeline"],
)
def test_a_tenants_text_reaches_no_terminal_as_escapes_or_markup(table: Any) -> None:
    out = printed(table(job_document()))

    assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out and "\x1b[1A" not in out
    assert "\\x1b]52;c;cm0gLXJm" in out and "[link=https://evil.example]x[/link]" in out


def test_shown_text_is_visible_and_escaped_and_keeps_lines() -> None:
    assert visible("a\x1bb\tc\nd\x7f") == "a\\x1bb\tc\nd\\x7f"
    assert shown("[bold]x[/]") == "\\[bold]x\\[/]"


def test_a_learners_log_is_made_visible_on_a_terminal_and_left_as_it_is_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    output = "step 1\r\x1b]52;c;ZWNobyBwd25lZA==\x07step 2\r\n"
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert job_commands._for_output(output) == "step 1\n\\x1b]52;c;ZWNobyBwd25lZA==\\x07step 2\n"
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert job_commands._for_output(output) == output
