"""Structured logs with structlog: JSON lines when stderr is not a TTY, coloured console otherwise.

One line per request (`request_done`) carries request id, tenant, model, worker,
prompt/cached/completion tokens, TTFT and TPOT in ms, and the outcome.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Set up structlog for the process; `json=None` picks JSON unless stderr is a TTY."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write per line: the gateway processes of one box share stderr, and print's
        # two writes (line, then newline) interleave between them.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
