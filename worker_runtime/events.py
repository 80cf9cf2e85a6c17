"""Standard output of a stage process: one JSON object per line and nothing else (contracts §1).

The agent parses every stdout line, so a stray ``print`` or library banner would break it: the writer
keeps the real stdout for itself and points ``sys.stdout`` at stderr, where logs belong.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO


class EventWriter:
    def __init__(self, stream: TextIO | None = None):
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        if stream is None:
            sys.stdout = sys.stderr

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields})
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class Every:
    """A periodic deadline for work a busy loop does between steps (heartbeats, stats lines)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._next = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True

    def remaining(self) -> float:
        return max(0.0, self._next - time.monotonic())
