"""The ledger of commands sent and not answered yet: only the command's own answer settles it, and
with a resend rule a command unanswered for long enough is forgotten, to be sent again."""

from __future__ import annotations

import uuid

import pytest

from ffdl.handlers.outstanding import Outstanding


def test_a_command_is_outstanding_until_an_event_it_caused_is_folded() -> None:
    ledger: Outstanding[str] = Outstanding()
    first, second = uuid.uuid4(), uuid.uuid4()
    ledger.sent("job", first, "offer 1")
    ledger.sent("job", second, "offer 2")  # replaces the first

    ledger.answered("job", first)  # the answer to an older command
    ledger.answered("job", None)  # an event no command caused
    assert "job" in ledger and ledger.promised("job") == "offer 2"

    ledger.answered("job", second)
    assert "job" not in ledger and ledger.promised("job") is None and not ledger.items()


def test_without_a_resend_rule_nothing_expires_and_forgetting_is_explicit() -> None:
    ledger: Outstanding[None] = Outstanding()
    for key in ("a", "b", "c"):
        ledger.sent(key, uuid.uuid4(), None)
    ledger.expire()
    ledger.forget("a")
    ledger.forget("never-sent")
    ledger.keep_only({"b", "z"})
    assert sorted(ledger.keys()) == ["b"]
    ledger.clear()
    assert not ledger.keys()


def test_with_a_resend_rule_a_command_unanswered_that_long_is_forgotten() -> None:
    now = [1000.0]
    ledger: Outstanding[int] = Outstanding(resend_after_s=5.0, clock=lambda: now[0])
    ledger.sent("old", uuid.uuid4(), 1)
    now[0] += 2.0
    ledger.sent("new", uuid.uuid4(), 2)

    now[0] += 2.5
    ledger.expire()
    assert sorted(ledger.keys()) == ["new", "old"]
    now[0] += 0.5
    ledger.expire()
    assert ledger.items() == [("new", 2)]


def test_a_resend_rule_and_its_clock_come_together() -> None:
    with pytest.raises(ValueError, match="clock"):
        Outstanding(resend_after_s=5.0)
    with pytest.raises(ValueError, match="clock"):
        Outstanding(clock=lambda: 0.0)
