"""Where a job's data and results may be, as its manifest names them (``data_dir``, ``result_dir``).

A place is one of:

* a URI (``s3://bucket/prefix``): the learners' business; the platform never opens it;
* a path relative to the learners' working directory (FfDL's data store containers, ``train-data``);
* an absolute path under one of the roots the operator configured for that kind of place.

No place climbs out with ``..``. The API refuses a manifest whose places are none of these, and the
reactor that measures a job's results checks again (the manifest may come from anywhere the log
accepts commands), after resolving links, before it looks at a single file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath, PurePosixPath

_URI = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(place: str) -> bool:
    return _URI.match(place) is not None


def place_problem(place: str, roots: Sequence[PurePath]) -> str | None:
    """Why ``place`` may not be a job's data or result place under ``roots`` (None: it may)."""
    if "\0" in place or "\n" in place:
        return "must not contain NUL or newline characters"
    if is_uri(place):
        return None
    path = PurePosixPath(place)
    if ".." in path.parts:
        return "must not contain '..'"
    if not path.is_absolute() or within(path, roots):
        return None
    configured = ", ".join(str(root) for root in roots) or "none are configured"
    return f"an absolute path must be under one of the configured roots ({configured})"


def within(path: PurePath, roots: Sequence[PurePath]) -> bool:
    """Whether ``path`` is one of ``roots`` or lies below one (compared as written: resolve first)."""
    return any(path.is_relative_to(root) for root in roots)
