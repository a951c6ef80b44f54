"""Structured build trace: key=value log events and the same records for the JSON report."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

LOGGER = logging.getLogger("ipu_stack")


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@dataclass(slots=True)
class Trace:
    """Collects events (message + fields) and phase timings, and logs each at INFO."""

    events: list[dict[str, Any]] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)
    quiet: bool = False  # record without logging (a worker whose parent logs the events)

    def event(self, message: str, **fields: Any) -> None:
        self.events.append({"event": message, **fields})
        if not self.quiet:
            LOGGER.info("%s %s", message, " ".join(f"{k}={_format(v)}" for k, v in fields.items()))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a named build phase; logs ``package build phase finished`` on exit."""
        start = time.perf_counter()
        success = False
        try:
            yield
            success = True
        finally:
            elapsed_ms = round((time.perf_counter() - start) * 1000)
            record = {"name": name, "elapsed_ms": elapsed_ms, "success": success}
            self.phases.append(record)
            self.event(
                "package build phase finished", phase=name, elapsed_ms=elapsed_ms, success=success
            )


class _StdoutHandler(logging.StreamHandler):
    """A closed stdout (``| head``) propagates to the CLI, which ends quietly."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            raise  # re-raise the BrokenPipeError being handled
        super().handleError(record)


def configure_logging(verbose: bool = True) -> None:
    """Route ipu_stack events to stdout as ``INFO message key=value ...`` (errors: stderr)."""
    handler = _StdoutHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(logging.INFO if verbose else logging.WARNING)
    LOGGER.propagate = False
