"""How motley names things across processes: devices, pipelines, stages and agent queues.

Each format is written here once, next to its parser, so a name built by the control plane is read
back by an agent, the telemetry hub or the dashboard without anyone keeping a copy of the pattern.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# The stage fork server (worker_runtime/fork_server.py) writes this file in its folder once it has
# imported and warmed up; the agent forks stages from it only then (agents/fork_server.py).
FORK_SERVER_WARM_FILE = "warm"
# The environment variable an agent sets for its stage processes: the folder where quantized layers are
# kept for the next process that loads them (worker_runtime/weight_cache.py).
WEIGHT_CACHE_ENV = "MOTLEY_WEIGHT_CACHE"

_STAGE_KEY = re.compile(r"^d(\d+)-r(\d+)-s(\d+)$")
_PIPELINE_ID = re.compile(r"^d(\d+)-r(\d+)$")


class StageKey(NamedTuple):
    deployment_id: int
    pipeline: int  # the physical pipeline's index (controlplane DeploymentStage.pipeline)
    stage_index: int


def device_name(node: str, index: int) -> str:
    """A device's fleet-wide name, "<node>/gpu<i>": what plans, telemetry and the inventory call it."""
    return f"{node}/gpu{index}"


def node_of_device(name: str) -> str:
    """The node part of a device name."""
    return name.split("/", 1)[0]


def pipeline_id(deployment_id: int, pipeline: int) -> str:
    """One physical pipeline, "d<deployment>-r<pipeline>": its stages' frames carry it."""
    return f"d{deployment_id}-r{pipeline}"


def parse_pipeline_id(text: str) -> tuple[int, int] | None:
    """(deployment_id, pipeline index) of a pipeline id, or None when it is not one."""
    match = _PIPELINE_ID.match(text)
    return (int(match[1]), int(match[2])) if match else None


def stage_key(deployment_id: int, pipeline: int, stage_index: int) -> str:
    """One stage process, "d<deployment>-r<pipeline>-s<stage>": how the controller and agents name it."""
    return f"{pipeline_id(deployment_id, pipeline)}-s{stage_index}"


def parse_stage_key(text: str) -> StageKey | None:
    """The parts of a stage key, or None when it is not one."""
    match = _STAGE_KEY.match(text)
    return StageKey(*(int(g) for g in match.groups())) if match else None


def node_queue(node_id: int) -> str:
    """The Celery queue one node's agent consumes: "node.<id>"."""
    return f"node.{node_id}"
