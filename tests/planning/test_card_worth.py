"""What a free card is worth to a deployment (planning/card_worth.py): the tokens/s it adds at the best
precision the deployment's quality budget allows, from the roofline cost model."""

from __future__ import annotations

import dataclasses

import pytest

from contracts.hardware import GIB
from controlplane.planning import PlanRequest, Workload, plan
from controlplane.planning.card_shares import Claimant, assign
from controlplane.planning.card_worth import CardWorth, assign_whole, card_worth, low_layer_budget
from tests.planning.factories import fleet, profile

# 32 layers of 300M parameters: 19 GB at 16 bits, more than a T4 holds; about 5 GB at int4.
MODEL = profile(layer_params=300_000_000)
FLEET = fleet({"new": ["A100"], "old": ["T4"]})


def request(bits: tuple[int, ...], max_quantized: float, **options) -> PlanRequest:
    return PlanRequest(fleet=FLEET, model=MODEL, workload=Workload(batch=4, context=2048), bits=bits,
                       max_quantized=max_quantized, **options)


def test_an_old_card_is_worth_more_to_the_model_allowed_int4_than_to_one_held_at_16_bits():
    t4 = FLEET.device("old/gpu0")
    held = card_worth(request((16,), 0.0), t4)
    half = card_worth(request((16, 8, 4), 0.5), t4)
    int4 = card_worth(request((16, 8, 4), 1.0), t4)
    assert (held.low_bits, held.low_layers) == (16, 0) and 0 < held.layers < MODEL.num_layers
    assert (int4.low_bits, int4.layers, int4.low_layers) == (4, MODEL.num_layers, MODEL.num_layers)
    assert half.low_bits == 4 and half.low_layers <= MODEL.num_layers // 2  # its share of the budget
    assert 0 < held.tokens_per_s < half.tokens_per_s < int4.tokens_per_s
    assert int4.tokens_per_s > 2.5 * held.tokens_per_s


def test_a_card_that_holds_the_whole_model_is_worth_the_planners_one_card_replica():
    allowed = request((16, 8, 4), 1.0)
    worth = card_worth(allowed, FLEET.device("new/gpu0"))
    alone = plan(dataclasses.replace(allowed, exclude_devices=("old/gpu0",), replicas=1))
    assert worth.layers == MODEL.num_layers
    assert worth.tokens_per_s == pytest.approx(alone.predicted.decode_tokens_per_s, rel=0.02)


def test_cards_that_each_hold_part_of_the_model_add_up_to_the_replica_they_form():
    """Two T4s that each hold three quarters of the model at 16 bits form one replica: half of it each."""
    pair = fleet({"a": ["T4", "T4"]})
    held = dataclasses.replace(request((16,), 0.0), fleet=pair, replicas=1)
    worths = [card_worth(held, d) for d in pair.devices]
    assert [w.layers for w in worths] == [MODEL.num_layers // 2] * 2
    together = plan(held).predicted.decode_tokens_per_s
    assert sum(w.tokens_per_s for w in worths) == pytest.approx(together, rel=0.1)


def test_a_card_that_cannot_hold_one_layer_is_worth_nothing():
    tiny = dataclasses.replace(FLEET.device("old/gpu0"), memory_bytes=GIB // 2)
    worth = card_worth(request((16, 8, 4), 1.0), tiny)
    assert (worth.tokens_per_s, worth.layers) == (0.0, 0)


def test_the_measured_budget_allows_the_least_sensitive_layers_within_max_kl():
    kl = tuple(0.05 if i % 4 == 0 else 0.5 for i in range(MODEL.num_layers))  # 8 layers at 0.05
    measured = dataclasses.replace(MODEL, sensitivity={4: kl})
    allowed = PlanRequest(fleet=FLEET, model=measured, bits=(16, 4), max_kl=0.21)
    assert low_layer_budget(allowed, 4) == 4  # 4 x 0.05 <= 0.21 < 5 x 0.05
    assert low_layer_budget(allowed, 8) == 0  # not an allowed precision
    assert low_layer_budget(request((16, 8, 4), 0.25), 4) == 8  # the count form: a quarter of 32


def test_the_assignment_gives_no_card_that_completes_no_replica():
    """Half a replica's card would meet chat's need by its worth, but alone it holds no replica: chat,
    the priority, gets the whole card instead, and batch (which only the whole card serves) nothing."""
    worths = {"chat": {"half/gpu0": CardWorth("half/gpu0", 50.0, 16, 16, 0, parts=2),
                       "whole/gpu0": CardWorth("whole/gpu0", 100.0, 32, 16, 0)},
              "batch": {"half/gpu0": CardWorth("half/gpu0", 0.0, 0, 16, 0),
                        "whole/gpu0": CardWorth("whole/gpu0", 100.0, 32, 4, 32)}}
    chat = Claimant("chat", priority=1, need=40, worth={"half/gpu0": 50, "whole/gpu0": 100})
    batch = Claimant("batch", priority=0, need=100, worth={"half/gpu0": 0, "whole/gpu0": 100})
    cards = ["half/gpu0", "whole/gpu0"]
    assert assign([chat, batch], cards) == {"half/gpu0": "chat", "whole/gpu0": "batch"}  # by worth alone
    assert assign_whole([chat, batch], cards, worths) == {"whole/gpu0": "chat"}
    two_halves = {**worths["chat"], "half/gpu1": CardWorth("half/gpu1", 50.0, 16, 16, 0, parts=2)}
    pair = Claimant("chat", priority=1, need=90, worth={"half/gpu0": 50, "half/gpu1": 50, "whole/gpu0": 0})
    assert assign_whole([pair], ["half/gpu0", "half/gpu1", "whole/gpu0"], {"chat": two_halves}) == {
        "half/gpu0": "chat", "half/gpu1": "chat"}  # two halves make a replica
