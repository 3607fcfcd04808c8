"""The bus adapters the contract suite runs against: add an adapter with one entry in ``BUS_FACTORIES``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest

from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.handlers.ports import Bus
from ffdl.wiring.config import KafkaConfig
from tests.contract.bus_contract import BusFactory, EmbeddedBusFactory
from tests.services import TansuBroker

#: tansu holds each join of a consumer group for about half the session timeout (at least 1 s), so
#: these buses keep sessions this short; a crash test asks for a shorter one still.
KAFKA_SESSION_TIMEOUT_S = 2.0


class KafkaBusFactory:
    """Kafka buses on one tansu broker shared by the whole session: tests use unique topics and groups."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    @asynccontextmanager
    async def open(self, partitions: int = 4, *, session_timeout_s: float = 10.0) -> AsyncIterator[Bus]:
        session_timeout_s = min(session_timeout_s, KAFKA_SESSION_TIMEOUT_S)
        settings = KafkaConfig(session_timeout_s=session_timeout_s, heartbeat_interval_s=0.2)
        bus = KafkaBus(self.bootstrap, partitions, settings=settings)
        await bus.start()
        try:
            yield bus
        finally:
            await bus.close()

    async def crash(self, bus: Bus) -> None:
        assert isinstance(bus, KafkaBus)
        await bus.abandon()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    broker = TansuBroker()
    broker.start()
    yield broker
    broker.stop()


def embedded_bus_factory(request: pytest.FixtureRequest) -> BusFactory:
    return EmbeddedBusFactory(request.getfixturevalue("tmp_path"))


def kafka_bus_factory(request: pytest.FixtureRequest) -> BusFactory:
    broker: TansuBroker = request.getfixturevalue("kafka_broker")
    return KafkaBusFactory(broker.bootstrap)


#: Adapter name -> a function of the test's fixture request that gives a factory on a fresh log
#: (it may ask the request for other fixtures, e.g. a broker).
BUS_FACTORIES: dict[str, Callable[[pytest.FixtureRequest], BusFactory]] = {
    "embedded": embedded_bus_factory,
    "kafka": kafka_bus_factory,
}


@pytest.fixture(params=sorted(BUS_FACTORIES))
def bus_factory(request: pytest.FixtureRequest) -> BusFactory:
    return BUS_FACTORIES[request.param](request)
