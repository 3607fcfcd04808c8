"""A ledger of commands sent and not answered yet: one per aggregate, forgotten once answered.

A role that decides commands from what it has folded (the scheduler) must not decide the same
command again while the first is on its way: the aggregate's owner has not answered it, so the
folded state does not show it yet. It records each command it sends here, with what the command
promised (GPUs offered, a reason recorded, a node observed), and counts it as done until the
owner's answer is on the log (an event whose ``causation_id`` is the command's id) or the role
finds it moot and forgets it.

A command that may go unanswered (an owner drops an observation it cannot confirm the sender of)
needs a resend rule: a ledger made with ``resend_after_s`` forgets, on :meth:`Outstanding.expire`,
every command older than that, so it is decided and sent again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, KeysView
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Sent(Generic[T]):
    command_id: uuid.UUID
    promised: T
    sent_at: float


class Outstanding(Generic[T]):
    """Commands sent, one per aggregate key, each with what it promised (``T``), until answered.

    ``clock`` (seconds) dates each command for the resend rule; without ``resend_after_s`` a command
    stays outstanding until it is answered or forgotten.
    """

    def __init__(
        self, *, resend_after_s: float | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        if (resend_after_s is None) != (clock is None):
            raise ValueError("a resend rule needs a clock, and a clock is only for a resend rule")
        self._resend_after_s = resend_after_s
        self._clock = clock
        self._sent: dict[str, _Sent[T]] = {}

    def sent(self, key: str, command_id: uuid.UUID, promised: T) -> None:
        """Record the command ``command_id`` sent to ``key``, in place of any earlier one."""
        self._sent[key] = _Sent(command_id, promised, self._clock() if self._clock is not None else 0.0)

    def answered(self, key: str, causation_id: uuid.UUID | None) -> None:
        """Forget the command to ``key`` if it caused the event (``causation_id``) just folded."""
        sent = self._sent.get(key)
        if sent is not None and sent.command_id == causation_id:
            del self._sent[key]

    def expire(self) -> None:
        """Forget every command unanswered for ``resend_after_s``: it is to be sent again."""
        if self._clock is None or self._resend_after_s is None:
            return
        now, after_s = self._clock(), self._resend_after_s
        for key in [key for key, sent in self._sent.items() if now - sent.sent_at >= after_s]:
            del self._sent[key]

    def forget(self, key: str) -> None:
        """Count the command to ``key`` (if any) as done: it was settled some other way."""
        self._sent.pop(key, None)

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the commands to aggregates not in ``keys`` (no longer this role's)."""
        for key in [key for key in self._sent if key not in keys]:
            del self._sent[key]

    def clear(self) -> None:
        self._sent.clear()

    def promised(self, key: str) -> T | None:
        """What the command outstanding to ``key`` promised; None when there is none."""
        sent = self._sent.get(key)
        return sent.promised if sent is not None else None

    def items(self) -> list[tuple[str, T]]:
        """Each aggregate with a command outstanding, and what that command promised."""
        return [(key, sent.promised) for key, sent in self._sent.items()]

    def keys(self) -> KeysView[str]:
        return self._sent.keys()

    def __contains__(self, key: object) -> bool:
        return key in self._sent
