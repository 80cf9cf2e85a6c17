"""The host tier of the KV prefix cache, priced: copy an evicted token's KV back, or compute it again.

A stage whose device evicts a named KV block may keep it in host memory and copy it back when a later
request reuses its prefix. Copies run on every stage at once, each over its own card's host link (its
PCIe figure), so a token comes back in the slowest stage's copy time; recomputing it is a prefill,
which runs through every stage in turn (and the hops between them), so it costs the pipeline's
prefill per token. The tier earns its host memory only where copying is the cheaper: an old card with
slow prefill and a fast link gets it, a fast card behind a narrow link does not.

Every stage of a pipeline holds the same named blocks in each tier (the head decides), so the
pipeline's tier is the smallest stage budget in tokens. Every stage is given the budget a stage holding
the whole model would have (the host memory granted per stage over the whole model's KV per token): no
stage's own budget is smaller, whatever the split, so moving a boundary changes no other stage's spec
(an untouched stage keeps running), at the price of leaving a stage of a few layers part of its grant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement


@dataclass(frozen=True)
class HostTier:
    copy_s: float  # one token's KV back from host memory: the slowest stage's copy
    recompute_s: float  # one token prefilled again: the pipeline's prefill per token
    tokens: int  # each stage's host budget in tokens (0: no tier)


def copy_back_s(device: DeviceSpec, kv_bytes_per_token: int) -> float:
    """Seconds to copy one token's KV of a stage's layers from host memory over its card's link."""
    return kv_bytes_per_token / (device.pcie_bandwidth_gbs * 1e9)


def host_tier(cost: CostModel, placements: Sequence[Placement], prefill_s: float) -> HostTier:
    """The tier of a pipeline of ``placements`` whose prefill of the workload's prompt takes
    ``prefill_s``: priced per token, and sized from the request's host memory per stage where the
    copy is the cheaper."""
    copy = 0.0
    for placement in placements:
        device = cost.device(placement.device)
        copy = max(copy, copy_back_s(device, cost.memory(device, placement).kv_bytes_per_token))
    recompute = prefill_s / cost.prompt
    whole_model = int(cost.kv[-1])  # KV bytes per token of every layer
    tokens = cost.request.host_kv_bytes // whole_model if copy < recompute and whole_model > 0 else 0
    return HostTier(copy, recompute, tokens)
