"""prometheus_client's multiprocess mode: the directory every process writes its values to.

prometheus_client reads ``PROMETHEUS_MULTIPROC_DIR`` when it is first imported: set, every process
keeps its metric values in files there (a scrape merges them, exposition.py); unset, in memory. This
module, imported before any value is written, makes sure the directory exists and that a process
exiting cleanly takes its live gauges (``livesum``: requests waiting and running) with it.
"""

from __future__ import annotations

import atexit
import os

from prometheus_client.multiprocess import mark_process_dead

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiproc_dir() -> str | None:
    """The shared directory of multiprocess mode, or None in single-process mode."""
    return os.environ.get(MULTIPROC_ENV) or None


def _on_exit(path: str) -> None:
    mark_process_dead(os.getpid(), path)  # the pid at exit: a forked child is not its parent


if (_path := multiproc_dir()) is not None:
    os.makedirs(_path, exist_ok=True)
    atexit.register(_on_exit, _path)
