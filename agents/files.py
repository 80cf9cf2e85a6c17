"""Files the agent and its stage processes read while it writes them: replaced whole, never rewritten in
place, so a reader (a stage loading its spec, the agent sweeping pid records after a kill -9 mid-write)
sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def replace_whole(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to a file of its own beside ``path`` (created with ``mode``), then rename it over
    ``path``."""
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.part")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(partial, path)
