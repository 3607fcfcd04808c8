"""The bus adapters the contract suite runs against: add an adapter with one entry in ``BUS_FACTORIES``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.contract.bus_contract import BusFactory, EmbeddedBusFactory


def embedded_bus_factory(request: pytest.FixtureRequest) -> BusFactory:
    return EmbeddedBusFactory(request.getfixturevalue("tmp_path"))


#: Adapter name -> a function of the test's fixture request that gives a factory on a fresh log
#: (it may ask the request for other fixtures, e.g. a broker).
BUS_FACTORIES: dict[str, Callable[[pytest.FixtureRequest], BusFactory]] = {
    "embedded": embedded_bus_factory,
}


@pytest.fixture(params=sorted(BUS_FACTORIES))
def bus_factory(request: pytest.FixtureRequest) -> BusFactory:
    return BUS_FACTORIES[request.param](request)
