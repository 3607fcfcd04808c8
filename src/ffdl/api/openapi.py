"""``python -m ffdl.api.openapi [FILE]``: export the OpenAPI document (default docs/openapi.json).

The exported file is committed; a test fails when the API changes without it being exported again.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ffdl.api.app import create_app
from ffdl.wiring.config import NodeConfig, Settings
from ffdl.wiring.platform import Platform

DEFAULT_PATH = Path("docs/openapi.json")


def openapi_document() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        settings = Settings(data_dir=Path(scratch), nodes=[NodeConfig(name="node")])
        platform = Platform(settings)
        try:
            return create_app(platform).openapi()
        finally:
            platform.projection.close()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    target.write_text(render())
    print(target)
