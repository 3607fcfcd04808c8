"""The heartbeat key layout (architecture §6), as the adapters' side sees it.

The layout itself lives in :mod:`ffdl.handlers.heartbeat_keys`, because the monitor is a handler
and handlers may not import adapters; the learner agent and the other adapters import it from here
so that there is exactly one definition of where a heartbeat lives.
"""

from __future__ import annotations

from ffdl.handlers.heartbeat_keys import JOBS_PREFIX, ParsedKey, exit_key, learner_key, parse_key

__all__ = ["JOBS_PREFIX", "ParsedKey", "exit_key", "learner_key", "parse_key"]
