"""The `jitops` logger prints its own progress lines to stderr, so a compile is visible in a notebook or a
terminal without any logging setup.  Configure the `jitops` logger (or JITOPS_LOG_LEVEL) to change that."""
from __future__ import annotations

import logging
import sys

from .config import config


class _LevelFromConfig(logging.Filter):
    """Reads JITOPS_LOG_LEVEL when a record is emitted, not at import."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            level = logging.getLevelName(config.log_level)
        except Exception:  # noqa: BLE001 - a bad value must not silence a compile error
            level = logging.INFO
        return record.levelno >= level


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record is emitted (notebooks and test runners replace it), like
    logging.lastResort."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def install_handler() -> None:
    logger = logging.getLogger("jitops")
    if any(getattr(h, "_jitops", False) for h in logger.handlers):
        return
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("[jitops] %(message)s"))
    handler.addFilter(_LevelFromConfig())
    handler._jitops = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # the handler's filter decides what shows
    logger.propagate = False  # an application's root handler would print every line twice
