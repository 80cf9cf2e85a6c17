"""The agent's settings, from its command line and two environment variables, each read here once with
its default (docs/configuration.md): ``MOTLEY_JOIN_TOKEN`` (a secret kept out of ``ps``) and
``MOTLEY_VAR_DIR``."""

from __future__ import annotations

import argparse
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from agents.admission import DEFAULT_TIME_SCALE
from agents.stage_process import DEFAULT_COMMAND, PROJECT_ROOT
from contracts.env import env_path, env_str


def join_token_from_env() -> str | None:
    """``MOTLEY_JOIN_TOKEN``: the join token when ``--join-token`` gives none."""
    return env_str("MOTLEY_JOIN_TOKEN", "") or None


def var_dir_from_env() -> Path:
    """``MOTLEY_VAR_DIR``: where the agents' state folders are (``agents/NAME``), else the checkout's var/."""
    return env_path("MOTLEY_VAR_DIR", PROJECT_ROOT / "var")


@dataclass(frozen=True)
class AgentConfig:
    server: str
    join_token: str
    name: str
    address: str | None  # None: the address on the route to the server
    state_dir: Path
    emulate: Path | None
    node: str | None
    stage_command: tuple[str, ...]
    time_scale: float


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m agents", description="The motley node agent.")
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="register this node and run the stages the control plane asks for")
    run.add_argument("--server", required=True, help="control plane URL, e.g. http://10.0.0.1:8000")
    run.add_argument("--join-token", default=join_token_from_env(),
                     help="join token (default: $MOTLEY_JOIN_TOKEN)")
    run.add_argument("--name", help="node name (default: --node when emulating, else the host name)")
    run.add_argument("--address", help="address other nodes reach this one at (default: auto)")
    run.add_argument("--emulate", type=Path, metavar="FLEET_FILE",
                     help="declare the devices from a fleet file instead of NVML (CPU workers)")
    run.add_argument("--node", help="which node of the fleet file this agent emulates")
    run.add_argument("--state-dir", type=Path,
                     help="spec, pid and log files (default: $MOTLEY_VAR_DIR/agents/NAME, "
                          "else var/agents/NAME of the checkout)")
    run.add_argument("--stage-command", default=shlex.join(DEFAULT_COMMAND),
                     help="command that runs one stage; '--spec FILE' is appended")
    run.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                     help="emulation: modeled step time multiplier (when the control plane sends none)")
    run.add_argument("--log-level", default="INFO")
    return root


def from_args(args: argparse.Namespace) -> AgentConfig:
    if not args.join_token:
        raise SystemExit("a join token is required: --join-token or MOTLEY_JOIN_TOKEN")
    if (args.emulate is None) != (args.node is None):
        raise SystemExit("--emulate FLEET_FILE and --node NODE go together")
    name = args.name or args.node or socket.gethostname().split(".")[0]
    var_dir = var_dir_from_env()
    return AgentConfig(
        server=args.server,
        join_token=args.join_token,
        name=name,
        address=args.address,
        # Absolute: stage processes run in folders of their own and are given paths under it.
        state_dir=(args.state_dir or var_dir / "agents" / name).resolve(),
        emulate=args.emulate,
        node=args.node,
        stage_command=tuple(shlex.split(args.stage_command)),
        time_scale=args.time_scale,
    )
