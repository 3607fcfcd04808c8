"""The API's JSON: every body a strict parser (a browser's ``JSON.parse``) accepts.

Learners report numbers, and an older platform's log may hold a ``NaN`` loss. Python's ``json``
writes such a number as a ``NaN`` token, which is no JSON, and Starlette's own response refuses it
with a 500. Every JSON the API sends goes through :func:`ffdl.events.reports.strict_dumps`, which
writes a non-finite number as ``null``.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ffdl.events.reports import strict_dumps


class StrictJSONResponse(JSONResponse):
    """A JSON response whose non-finite numbers are ``null`` (the API's default response class)."""

    def render(self, content: Any) -> bytes:
        return strict_dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
