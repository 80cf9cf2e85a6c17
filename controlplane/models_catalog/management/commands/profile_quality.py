"""``python manage.py profile_quality MODEL``: measure per-layer sensitivity to int8/int4 and store it."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from contracts.profiler import DEFAULT_GROUP_SIZE
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.services import model_quality_record


class Command(BaseCommand):
    help = (
        "Measure, on a calibration text, the KL divergence of next-token distributions and the perplexity "
        "when each layer alone runs at int8 and at int4, and the whole model's perplexity at fp32, bf16, "
        "int8 and int4; store it with the model (the planner's measured quality budget reads it)."
    )

    def add_arguments(self, parser):
        parser.add_argument("model", help="catalog name or id of a model with weights")
        parser.add_argument("--tokens", type=int, default=1024, help="calibration tokens (default 1024)")
        parser.add_argument("--held-tokens", type=int,
                            help="held-out tokens for perplexity (default: the rest)")
        parser.add_argument("--window", type=int, default=256, help="tokens per independent sequence")
        parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE, help="int4 group size")
        parser.add_argument("--text",
                            help="calibration text file (default: examples/calibration/apache-2.0.txt)")

    def handle(self, *args, **options):
        from worker_runtime.quality import measure_quality  # torch: only when measuring

        ref = options["model"]
        model = LlmModel.objects.filter(name=ref).first() or (
            LlmModel.objects.filter(pk=int(ref)).first() if ref.isdigit() else None
        )
        if model is None:
            raise CommandError(f"no model named {ref!r}")
        if not model.has_weights:
            raise CommandError(f"model {model.name} has no weights (registered from a config only)")
        verbose = options["verbosity"] > 1
        try:
            report = measure_quality(
                model.path, text_file=options["text"], tokens=options["tokens"],
                held_tokens=options["held_tokens"], window=options["window"],
                group_size=options["group_size"],
                progress=(lambda m: self.stdout.write(m)) if verbose else None,
            )
            model_quality_record(model=model, report=report.to_dict())
        except (ValueError, ValidationError) as exc:
            raise CommandError(str(exc)) from None
        ppl = report.perplexity
        fp32 = ppl["fp32"]
        figures = ", ".join(f"{k} {v:.3f} ({(v / fp32 - 1) * 100:+.2f} %)" for k, v in ppl.items())
        worst = {b: max(range(len(kl)), key=kl.__getitem__) for b, kl in report.layer_kl.items()}
        self.stdout.write(self.style.SUCCESS(
            f"model {model.name}: held-out perplexity {figures}; most sensitive layer "
            + ", ".join(f"int{b} {layer} (KL {report.layer_kl[b][layer]:.2e})" for b, layer in worst.items())
            + f"; {report.seconds:.0f} s"
        ))
