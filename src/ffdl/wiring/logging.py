"""structlog set-up: JSON lines in production, readable lines on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(fmt: str = "console", level: str = "info", stream: TextIO = sys.stderr) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=stream)
