"""The processor runtime's guards: a record that makes a role raise is skipped and counted (the
partition goes on), an unreachable world is no poison (it propagates, so the batch is retried),
and a fold of newly assigned partitions that fails is done again before anything is handled."""

from __future__ import annotations

from typing import Any

import pytest

from ffdl.core.aggregate import Applied
from ffdl.events.codec import event_to_json
from ffdl.events.envelope import Event
from ffdl.handlers.messaging import event_records
from ffdl.handlers.ports import Bus, BusUnavailable, OutgoingRecord, Record, TopicPartition
from ffdl.handlers.runtime import EventFollower
from tests.flaky_log import BrokenRead
from tests.job_history import submission

TOPIC = "ffdl.events"


def record(offset: int, event: Event) -> Record:
    return Record(TOPIC, 0, offset, event.key, event_to_json(event))


class Picky(EventFollower):
    """A role whose policy raises for one job (a bug, a value no check foresaw)."""

    def __init__(self, bus: Bus, fails_with: BaseException) -> None:
        super().__init__(bus, TOPIC)
        self.fails_with = fails_with
        self.handled: list[str] = []
        self.loads = 0

    async def policy(self, applied: Applied[Any, Any]) -> None:
        job_id = applied.kind.identity(applied.event)
        if job_id == "poison":
            raise self.fails_with
        self.handled.append(job_id)

    async def loaded(self, partitions: list[int]) -> None:
        self.loads += 1


async def test_a_record_the_policy_raises_on_is_skipped_and_the_partition_goes_on(bus: Bus) -> None:
    role = Picky(bus, IndexError("rank 99"))
    records = [
        record(0, submission("before")),
        record(1, submission("poison")),
        record(2, submission("after")),
    ]

    await role.process(records)

    assert role.handled == ["before", "after"]
    assert role.poisoned == 1


async def test_an_unreachable_world_is_no_poison_it_propagates_for_the_batch_to_be_retried(bus: Bus) -> None:
    role = Picky(bus, BusUnavailable("the log is down"))

    with pytest.raises(BusUnavailable):
        await role.process([record(0, submission("poison")), record(1, submission("after"))])

    assert role.poisoned == 0
    assert role.handled == []


async def test_a_fold_that_breaks_off_on_assignment_is_done_again_before_anything_is_handled(
    bus: Bus,
) -> None:
    await bus.publish(TOPIC, [_outgoing(submission("first")), _outgoing(submission("second"))])
    flaky = BrokenRead(bus)
    role = Picky(flaky, IndexError())  # type: ignore[arg-type]

    await role.on_assigned(frozenset({TopicPartition(TOPIC, 0)}))

    assert flaky.breaks_left == 0  # the first fold did break off
    assert role.loads == 1  # loaded (and so handed records) once, after the whole fold
    assert sorted(role.book.jobs) == ["first", "second"]


def _outgoing(event: Event) -> OutgoingRecord:
    [out] = event_records([event], "test")
    return out
