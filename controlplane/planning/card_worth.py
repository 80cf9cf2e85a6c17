"""What a free card is worth to a deployment: the decode tokens/s it adds, at the best precision the
deployment's quality budget allows, for the joint assignment of cards to models (``card_shares``).

The price is the roofline cost model's (``CostModel``), one request and one card at a time, with no
planner search, so that a policy pass can price every free card for every deployment that wants
more:

- the card holds the most layers ``L`` of the model (``[0, L)``: a replica's first stage, the
  embedding counted; the whole model with its head when ``L`` is every layer) that fit its usable
  memory with the KV of the request's whole batch at full context, as the planner's stages must;
- at each precision allowed: 16 bits, and each lower one with the card's share of one replica's
  quality budget, in proportion to the layers it holds (``low_layer_budget``: the count form's
  ``max_quantized``, or in the measured form the most layers, least sensitive first, whose summed
  KL stays within ``max_kl``), the low-bit layers last as the planner places them;
- a decode step there at the whole batch takes ``T`` (``CostModel.split_times``: memory, FLOPs,
  overheads, calibration and throttling of that card). A replica of cards like it has ``n / L``
  stages in a row, and a memory-bound decode round is about the sum of its stages' steps, so it
  serves ``batch * L / (n * T)`` tokens/s; the card is the share ``L / n`` of such a replica, so it
  is worth ``batch * L**2 / (n**2 * T)``. Cards that each hold the whole model are each worth a
  replica (``batch / T``, its head included, exactly the planner's one-card replica); two that each
  hold half, one replica between them: worths add up as the assignment assumes. A card that holds
  the whole model is priced so; another at the ``L`` worth most. The precision worth most is kept;
  a card that cannot hold one layer is worth 0. Worths count the room a card has: two cards that
  each hold three quarters of the model are worth one and a half copies' rate, though they form one
  replica (the rest is room for a part of another).

So an old card with little memory and bandwidth is worth more to a model allowed int4 (it holds more
layers and reads fewer bytes a step) than to one held at 16 bits. The figure is an estimate for
choosing who gets which card, not a plan: the deployment's re-plan on the cards it is given decides
what it serves (docs/planner.md, "Several models on one fleet").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel
from controlplane.planning.request import PlanRequest


@dataclass(frozen=True)
class CardWorth:
    device: str
    tokens_per_s: float  # 0: the card cannot hold one layer
    layers: int  # decoder layers it holds at that worth
    low_bits: int  # the precision of its low-bit layers (16: none)
    low_layers: int

    def as_dict(self) -> dict:
        return {"tokens_per_s": round(self.tokens_per_s, 2), "layers": self.layers,
                "low_bits": self.low_bits, "low_layers": self.low_layers}


def low_layer_budget(request: PlanRequest, low_bits: int) -> int:
    """Decoder layers of one replica that may run at ``low_bits`` within the request's quality budget."""
    if low_bits not in request.bits:
        return 0
    if request.measured:  # the least sensitive layers first, while their summed KL stays within max_kl
        kl = np.cumsum(sorted(request.model.sensitivity[low_bits]))
        return int(np.searchsorted(kl, request.max_kl + 1e-12, side="right"))
    return request.quantized_layer_budget


def card_worth(request: PlanRequest, device: DeviceSpec, cost: CostModel | None = None) -> CardWorth:
    """The tokens/s ``device`` adds to a deployment planned with ``request`` (module docstring);
    ``cost`` is the request's cost model, shared across the cards priced for one request."""
    cost = cost or CostModel(request)
    n, batch = cost.num_layers, cost.batch
    held = np.arange(1, n + 1)
    best = CardWorth(device.name, 0.0, 0, 16, 0)
    options = [(16, np.zeros(n, dtype=int))] if 16 in request.bits else []
    for low_bits in (b for b in request.sorted_bits if b < 16):
        budget = low_layer_budget(request, low_bits) if 16 in request.bits else n
        options.append((low_bits, np.minimum(held, budget * held // n)))
    for low_bits, low_layers in options:
        times = cost.split_times(device, low_bits, batch, np.zeros(n, dtype=int), held, low_layers)
        worth = np.where(np.isfinite(times), batch * held.astype(float) ** 2 / (n * n * times), 0.0)
        at = n - 1 if worth[-1] > 0 else int(np.argmax(worth))  # the whole model: a replica of its own
        if worth[at] > best.tokens_per_s:
            best = CardWorth(device.name, float(worth[at]), int(held[at]),
                             low_bits if low_layers[at] else 16, int(low_layers[at]))
    return best
