"""The configured inventory: the nodes the settings list, or the one machine the platform runs on.

The embedded default's inventory source. The configuration is read once, at start: editing it
and restarting the scheduler is how nodes join, leave or are cordoned (``schedulable: false``)
there, and the scheduler records each such change as node events. Operators drain and cordon at
run time through the CLI or the HTTP API instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from ffdl.core.allocator import Node
from ffdl.core.nodes import InventoryObservation


class ConfiguredInventory:
    SOURCE = "configuration"

    def __init__(self, nodes: Sequence[Node]) -> None:
        self._observation = InventoryObservation({node.name: node for node in nodes}, source=self.SOURCE)

    def observe(self) -> InventoryObservation:
        return self._observation
