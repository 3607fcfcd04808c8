"""The API's JSON: every body a strict parser (a browser's ``JSON.parse``) accepts.

Learners report numbers, and an older platform's log may hold a ``NaN`` loss. Python's ``json``
writes such a number as a ``NaN`` token, which is no JSON, and Starlette's own response refuses it
with a 500. Every JSON the API sends goes through :func:`ffdl.events.reports.strict_dumps`, which
writes a non-finite number as ``null``.

Text is sent as UTF-8, but an older platform's log may hold text UTF-8 cannot encode: a lone
UTF-16 surrogate in a label, which submissions now refuse and which made every read of its job a
500. A body holding such text is written with ``\\u`` escapes, as the job list, the event streams and
the projection write every document.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ffdl.events.reports import strict_dumps


class StrictJSONResponse(JSONResponse):
    """A JSON response whose non-finite numbers are ``null`` and whose text always encodes (the
    API's default response class, and its refusals')."""

    def render(self, content: Any) -> bytes:
        try:
            return strict_dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:
            return strict_dumps(content, separators=(",", ":")).encode()
