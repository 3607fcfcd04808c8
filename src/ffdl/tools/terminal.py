"""Text that others wrote (a tenant's reasons, labels and output, a trace's names, a log file), as an
operator's terminal may show it."""

from __future__ import annotations

import re

from rich.markup import escape

#: What a terminal acts on rather than shows: C0 controls but tab and newline, DEL, and C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with its control characters as visible escapes (``\\x1b``): what a terminal shows
    rather than acts on."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def shown(text: str) -> str:
    """``text`` that a tenant (or a trace, a log file) wrote, as a table or a line may show it: its
    control characters as visible escapes, its markup escaped. A job's reason or a metric name once
    put an escape sequence in an operator's terminal (a clipboard write, a cursor move that hid
    lines, a link whose text lied) or, holding ``[/]``, ended ``ffdl status`` with a traceback."""
    return escape(visible(text))
