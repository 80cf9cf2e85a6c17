"""New specs for a running stage process, read from its stdin: how a stage changes in place (contracts §1).

A stage restarted for a new spec spends its exit, a new process's start and the load of every layer
inside an in-place handover's pause; the stage before a moved one restarted only because the address
of its next stage changed. So the agent writes a new spec's path on the running process's stdin when
the process can take it (``contracts.stage_spec.respec_blocker``): the stage leaves its pipeline as a
replaced one does (the head fails what is in flight, a relay says it leaves), loads only the layers it
did not hold, points its links at the new neighbours, says ``ready`` again and rejoins, all in the
same process and on the same listening socket.

A reader thread takes the lines; the serving loop asks :meth:`SpecInbox.pending` each turn, and the
latest path wins when several came in between. A closed stdin (the agent is gone: the process dies
with it anyway) ends the thread and nothing else.
"""

from __future__ import annotations

import threading
from typing import TextIO


class SpecInbox:
    def __init__(self) -> None:
        self._path: str | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Event()

    def listen(self, stream: TextIO) -> None:
        """Read spec paths from ``stream`` (one a line) on a daemon thread."""
        threading.Thread(target=self._read, args=(stream,), name="spec-inbox", daemon=True).start()

    def pending(self) -> bool:
        """Whether a new spec waits: the serving loop ends as for a replaced stage."""
        return self._arrived.is_set()

    def wait(self, stop: threading.Event) -> bool:
        """Block until a new spec waits (True) or ``stop`` is set (False): a held stage (contracts §1)."""
        while not stop.is_set():
            if self._arrived.wait(0.05):
                return True
        return False

    def take(self) -> str | None:
        """The newest spec path sent since the last take, or None."""
        with self._lock:
            path, self._path = self._path, None
            self._arrived.clear()
        return path

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            if path := line.strip():
                with self._lock:
                    self._path = path
                    self._arrived.set()
