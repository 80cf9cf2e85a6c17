"""Registering a GGUF file: where its converted checkpoint goes, when it is converted again, what is refused.

A GGUF file is converted (``gguf_import.import_gguf``) into ``MOTLEY_MODEL_IMPORT_DIR/<name>/`` and that
directory is registered like any checkpoint. Registering the same file under the same name again
converts it only if the file changed (size or time) or another dtype is asked for, so scripts can
register at every start. Converting happens outside any database transaction.
"""

from __future__ import annotations

import fcntl
import re
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError

from controlplane.models_catalog.gguf_import import (
    DTYPES,
    GGUFImportError,
    import_gguf,
    is_current,
    read_record,
)
from controlplane.models_catalog.models import LlmModel


def is_gguf(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def import_dir(name: str) -> Path:
    """The directory a model of this name is converted into (the name, made safe for a file system)."""
    return settings.MOTLEY_MODEL_IMPORT_DIR / (re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "model")


def gguf_checkpoint(*, source: Path, name: str | None, dtype: str | None) -> tuple[Path, str]:
    """Convert ``source`` (resolved, allowed) unless a current conversion is there; (directory, name).

    Refused, before anything is written: a name registered from another file or directory, a
    directory another model is registered from, an unknown dtype, and any file the import refuses
    (its message, under ``path``).
    """
    dtype = dtype or settings.MOTLEY_MODEL_IMPORT_DTYPE
    if dtype not in DTYPES:
        raise ValidationError({"dtype": f"{dtype!r} is not one of {', '.join(DTYPES)}"})
    if not source.is_file():
        raise ValidationError({"path": f"{source}: no such file"})
    name = name or source.stem
    directory = import_dir(name)
    existing = LlmModel.objects.filter(name=name).first()
    if existing is not None:
        record = read_record(directory) if existing.path == str(directory) else None
        if record is None or record.get("source") != str(source):
            origin = record.get("source") if record else existing.path or "an uploaded config"
            raise ValidationError(
                {"name": f"a model named {name!r} is already registered (from {origin}); choose another name"}
            )
    other = LlmModel.objects.filter(path=str(directory)).exclude(name=name).first()
    if other is not None:
        raise ValidationError({"name": f"{directory} holds model {other.name!r}; choose another name"})
    with _locked(settings.MOTLEY_MODEL_IMPORT_DIR):
        if not is_current(directory, source, dtype):
            try:
                import_gguf(source, directory, dtype=dtype)
            except GGUFImportError as exc:
                raise ValidationError({"path": str(exc)}) from None
    return directory, name


@contextmanager
def _locked(directory: Path):
    """One conversion at a time, across processes (each takes memory and every core)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".import.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
