"""``python manage.py register_model PATH [--name NAME] [--dtype DTYPE]``: add a model to the catalog."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.models_catalog.gguf_import import DTYPES
from controlplane.models_catalog.services import model_register


class Command(BaseCommand):
    help = (
        "Register a Hugging Face-format checkpoint directory, a GGUF file (converted into "
        "MOTLEY_MODEL_IMPORT_DIR/<name>/), or a bare config.json for planning only. "
        "Registering the same path again refreshes it."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="checkpoint directory, FILE.gguf or config.json")
        parser.add_argument("--name", help="catalog name (default: the directory's name, a GGUF file's stem)")
        parser.add_argument(
            "--dtype", choices=DTYPES,
            help="GGUF only: the dtype its weights are stored in (default: MOTLEY_MODEL_IMPORT_DTYPE)",
        )

    def handle(self, *args, **options):
        try:
            model = model_register(
                path=options["path"], name=options["name"], dtype=options["dtype"], actor=actor_cli()
            )
        except ValidationError as exc:
            if hasattr(exc, "error_dict"):
                lines = [f"{field}: {m}" for field, messages in exc.message_dict.items() for m in messages]
            else:
                lines = exc.messages
            raise CommandError("; ".join(lines)) from None
        weights = "weights present" if model.has_weights else "config only: planning, not deployable"
        self.stdout.write(
            self.style.SUCCESS(
                f"model {model.name} (id {model.id}): {model.model_type}, {model.num_layers} layers, "
                f"{model.total_params / 1e9:.2f}B parameters; {weights} (in {model.path})"
            )
        )
