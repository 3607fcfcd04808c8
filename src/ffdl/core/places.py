"""Where a job's data and results may be, as its manifest names them (``data_dir``, ``result_dir``),
and where its checkpoints must lie (:class:`CheckpointPlaces`).

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
from dataclasses import dataclass
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


#: What a job id is replaced for in a checkpoint place's template.
JOB_ID_FIELD = "{job_id}"
_SCHEME = re.compile(r"\A([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(/.*)?\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class CheckpointPlaces:
    """Where each job's checkpoints must lie (DESIGN §6a): a template naming a directory or a URI
    prefix, with ``{job_id}`` where the job's id goes (``/learners/{job_id}/checkpoints``,
    ``s3://bucket/ckpt/{job_id}``, or ``/ffdl/checkpoints`` where each job sees only its own).

    A checkpoint a learner reports is believed only inside its job's place: anything else could be
    a file another tenant planted, which the next attempt would load (``torch.load`` runs code).
    The rule is lexical, on the URI as written, because the platform never opens a checkpoint and
    the learner reads the path as written: ``..``, ``.``, empty segments, percent-encoding,
    backslashes and control characters are refused outright instead of being interpreted, and a
    ``file`` URI must name no host. Links inside the place are the job's own business: only its
    learners can write there.
    """

    template: str

    def place(self, job_id: str) -> str | None:
        """The job's place, or None when its id cannot name one (a ``/``, ``..``, ``%``...)."""
        if JOB_ID_FIELD in self.template and _segment_problem(job_id):
            return None
        return self.template.replace(JOB_ID_FIELD, job_id)

    def problem(self, job_id: str, uri: str) -> str | None:
        """Why a checkpoint at ``uri`` may not be one of the job's (None: it may)."""
        place = self.place(job_id)
        if place is None:
            return f"the job id {job_id!r:.80} names no checkpoint place"
        return checkpoint_problem(uri, place)


def checkpoint_problem(uri: str, place: str) -> str | None:
    """Why ``uri`` does not lie strictly inside ``place`` (a directory or a URI prefix); None if it does."""
    where = _split(place)
    if where is None:
        return f"the checkpoint place {place!r:.200} is not an absolute path or a URI"
    found = _split(uri)
    if found is None:
        return "it is not an absolute path, a file:// URI without a host, or a URI"
    scheme, authority, parts = found
    if (scheme, authority) != where[:2]:
        return f"it does not lie in the job's checkpoint place {place}"
    for part in parts:
        if problem := _segment_problem(part):
            return f"its path {problem}"
    base = where[2]
    if len(parts) <= len(base) or parts[: len(base)] != base:
        return f"it does not lie in the job's checkpoint place {place}"
    return None


def _split(uri: str) -> tuple[str, str, list[str]] | None:
    """(scheme, authority, path segments) of an absolute path (a ``file`` URI) or a URI; a single
    trailing slash is dropped (a directory), every other empty segment is kept (and refused)."""
    if uri.startswith("/"):
        scheme, authority, path = "file", "", uri
    else:
        match = _SCHEME.match(uri)
        if match is None:
            return None
        # the scheme as written: a reader that strips "file://" leaves "FILE://" as a relative path
        scheme, authority, path = match.group(1), match.group(2), match.group(3) or "/"
        if scheme == "file" and authority:
            return None  # file://host/...: another machine's file, or a trick on a parser
    segments = path.split("/")[1:]
    if len(segments) > 1 and segments[-1] == "":
        segments.pop()
    return scheme, authority, segments


def _segment_problem(part: str) -> str | None:
    if part in ("", ".", ".."):
        return f"has an empty, '.' or '..' segment ({part!r})"
    if "/" in part or "%" in part or "\\" in part:
        return f"has a slash, percent-encoding or a backslash ({part[:80]!r})"
    if not part.isprintable():
        return f"has unprintable characters ({part[:80]!r})"
    return None
