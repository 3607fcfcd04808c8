"""A plugin loaded before any conftest (``-p`` in pyproject.toml's pytest ``addopts``).

The CLI's console (``ffdl.cli.render``) reads the terminal's size from ``COLUMNS`` and ``LINES`` when it is
made, at import, and keeps it. The tests give each command they run the width it is judged at
(CliRunner's ``env``), so a width the test process inherited must not be read first: pytest-xdist
starts its workers with ``COLUMNS=80``, which squeezed the wide tables of ``ffdl replay``.
"""

from __future__ import annotations

import os

for name in ("COLUMNS", "LINES"):
    os.environ.pop(name, None)
