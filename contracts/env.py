"""Typed reads of environment variables: how every process reads its settings (docs/configuration.md).

Each setting is read in one place with its type and default: the control plane's in
``controlplane/settings.py``, the agent's in ``agents/config.py``, a stage worker's in
``worker_runtime/config.py``. An unset variable gives the default; a set one is parsed as the type, and
a value that does not parse raises (a typo is not taken for the default).
"""

from __future__ import annotations

import os
from pathlib import Path

TRUE_WORDS = ("1", "true", "yes", "on")


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(default if value is None else value)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(default if value is None else value)


def env_bool(name: str, default: bool) -> bool:
    """``1``, ``true``, ``yes`` or ``on`` (any case) is true, anything else false."""
    value = os.environ.get(name)
    return default if value is None else value.lower() in TRUE_WORDS


def env_path(name: str, default: str | Path) -> Path:
    """The variable's path, else ``default`` (an empty value counts as unset)."""
    return Path(os.environ.get(name) or default)


def env_list(name: str, default: str, sep: str = ",") -> tuple[str, ...]:
    """The ``sep``-separated items, stripped, empty ones dropped."""
    return tuple(item.strip() for item in os.environ.get(name, default).split(sep) if item.strip())
