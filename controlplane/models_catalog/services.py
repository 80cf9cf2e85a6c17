"""Registering models: read the config, refuse what motley cannot run, store the profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from contracts.model_config import ModelConfig, UnsupportedModelError
from contracts.profiler import profile_model
from controlplane.audit.services import SYSTEM, Actor, Target, audit_record
from controlplane.models_catalog.gguf_registration import gguf_checkpoint, is_gguf
from controlplane.models_catalog.models import LlmModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def model_register(
    *, path: str | Path | None = None, config: dict[str, Any] | None = None, name: str | None = None,
    dtype: str | None = None, actor: Actor = SYSTEM,
) -> LlmModel:
    """Register a checkpoint directory (or a bare config.json), a GGUF file, or an uploaded config for
    planning only.

    ``path`` is on the control plane's filesystem. A ``.gguf`` file is first converted into
    ``MOTLEY_MODEL_IMPORT_DIR/<name>/`` (weights stored as ``dtype``, default
    ``MOTLEY_MODEL_IMPORT_DTYPE``; docs/models.md), outside the transaction, and that directory is
    registered. Registering the same path under the same name again re-reads it (the checkpoint may
    have gained weights; a GGUF file is converted again only if it changed), so scripts can run this
    at every start; any other clash of names is refused. An unsupported architecture is refused with
    the config field at fault. Audited: ``model.registered`` by ``actor`` (``detail.refreshed`` when
    the entry existed, ``detail.source`` the GGUF file).
    """
    if (path is None) == (config is None):
        raise ValidationError("give either path (a checkpoint directory or config.json) or config, not both")
    source = None
    if path is not None and is_gguf(path):
        source = Path(path).expanduser().resolve()
        _check_allowed(source)
        path, name = gguf_checkpoint(source=source, name=name, dtype=dtype)
    elif dtype is not None:
        raise ValidationError({"dtype": "only a GGUF file is converted; a checkpoint keeps its own dtype"})
    return _register(path=path, config=config, name=name, source=source, actor=actor)


@transaction.atomic
def _register(
    *, path: str | Path | None, config: dict[str, Any] | None, name: str | None, source: Path | None,
    actor: Actor,
) -> LlmModel:
    if path is not None:
        path = Path(path).expanduser().resolve()
        if source is None:  # a GGUF file's conversion is the control plane's own directory
            _check_allowed(path)
        raw = _read_config(path)
        # A bare config.json is for planning only, even where weights happen to sit beside it.
        name = name or (path.name if path.is_dir() else path.parent.name)
        has_weights = path.is_dir() and any(path.glob("*.safetensors"))
        has_tokenizer = path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES)
        stored_path = str(path)
    else:
        if not name:
            raise ValidationError({"name": "a name is required when uploading a config"})
        raw, has_weights, has_tokenizer, stored_path = config, False, False, ""
    try:
        parsed = ModelConfig.from_dict(raw)
    except UnsupportedModelError as exc:
        raise ValidationError({"config": str(exc)}) from None
    existing = LlmModel.objects.select_for_update(no_key=True).filter(name=name).first()
    if existing is not None and not (stored_path and existing.path == stored_path):
        raise ValidationError({"name": f"a model named {name!r} is already registered; choose another name"})
    profile = profile_model(parsed, name)
    model = existing or LlmModel(name=name)
    model.path = stored_path
    model.config = raw
    model.profile = profile.to_dict()
    if existing is not None and existing.quality.get("layer_kl"):  # a refresh keeps what was measured
        model.profile["sensitivity"] = existing.quality["layer_kl"]
    model.model_type = parsed.model_type
    model.num_layers = parsed.num_layers
    model.hidden_size = parsed.hidden_size
    model.total_params = profile.total_params
    model.torch_dtype = parsed.torch_dtype
    model.has_weights = has_weights
    model.has_tokenizer = has_tokenizer
    model.full_clean()
    model.save()
    audit_record(actor=actor, action="model.registered", target=_target(model), detail={
        "path": stored_path, "refreshed": existing is not None, "has_weights": has_weights,
        "model_type": parsed.model_type, "num_layers": parsed.num_layers,
        **({"source": str(source)} if source is not None else {}),
    })
    return model


@transaction.atomic
def model_quality_record(*, model: LlmModel, report: dict[str, Any]) -> LlmModel:
    """Store a ``worker_runtime.quality`` report with the model; its per-layer KL becomes the
    profile's ``sensitivity``, which the planner's measured quality budget reads."""
    if model.num_layers != len(next(iter(report["layer_kl"].values()), [])):
        raise ValidationError({"quality": f"the report does not cover the model's {model.num_layers} layers"})
    model.quality = report
    model.profile = {**model.profile, "sensitivity": report["layer_kl"]}
    model.save(update_fields=["quality", "profile", "last_updated"])
    return model


@transaction.atomic
def model_unregister(*, model: LlmModel, actor: Actor = SYSTEM) -> None:
    """Remove a model from the catalog (its files are not touched); audited as ``model.unregistered``.
    A model a deployment or a plan revision still uses is protected: the delete raises, and the
    transaction, entry included, rolls back."""
    audit_record(actor=actor, action="model.unregistered", target=_target(model), detail={"path": model.path})
    model.delete()


def _target(model: LlmModel) -> Target:
    return Target(type="model", id=str(model.pk), label=model.name)


def _check_allowed(path: Path) -> None:
    """Refuse a path outside ``MOTLEY_MODEL_DIRS`` (when set), before reading anything from it.

    ``path`` is resolved, so a symlink inside an allowed directory that points outside is refused too.
    """
    allowed = settings.MOTLEY_MODEL_DIRS
    if allowed and not any(path.is_relative_to(directory) for directory in allowed):
        dirs = ", ".join(str(d) for d in allowed)
        raise ValidationError(
            {"path": f"{path} is outside the model directories this control plane reads ({dirs})"}
        )


def _read_config(path: Path) -> Any:
    """The raw JSON config of a checkpoint directory or of a config.json file."""
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        problem = "no config.json in this directory" if path.is_dir() else "no such file or directory"
        raise ValidationError({"path": f"{path}: {problem}"})
    try:
        return json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError({"path": f"{config_file}: not a readable JSON file ({exc})"}) from None
