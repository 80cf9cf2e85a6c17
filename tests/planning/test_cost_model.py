"""The cost model"s first-principles figures on numbers one can check by hand."""

from __future__ import annotations

import pytest

from contracts.hardware import GIB
from controlplane.planning import PlanRequest, Workload
from controlplane.planning import cost_model as cm
from controlplane.planning.plan import Placement
from tests.planning.factories import fleet, profile


def setup(**workload):
    request = PlanRequest(fleet({"n": ["A100", "T4"]}), profile(10, layer_params=500_000_000),
                          Workload(**{"batch": 1, "context": 1024, "prompt_tokens": 1024, **workload}))
    return request, cm.CostModel(request)


def test_decode_of_one_sequence_is_weight_bandwidth_bound():
    request, cost = setup()
    a100 = request.fleet.device("n/gpu0")
    weights = 5 * 2 * 500_000_000
    kv = 5 * profile().layers[0].kv_bytes_per_token * 1024
    expected = (weights + kv) / (2039e9 * cm.BANDWIDTH_EFFICIENCY) + 5 * cm.LAYER_OVERHEAD_S
    assert cost.decode_s(a100, Placement("n/gpu0", 2, 7, 16), 1) == pytest.approx(expected)
    assert cost.limiting_resource(a100, Placement("n/gpu0", 2, 7, 16), 1) == "memory bandwidth"
    # Fewer bits, fewer bytes: int4 about 3.5x faster on these layers.
    low, full = Placement("n/gpu0", 2, 7, 4), Placement("n/gpu0", 2, 7, 16)
    assert cost.decode_s(a100, low, 1) < cost.decode_s(a100, full, 1) / 3


def test_large_micro_batches_become_compute_bound():
    request, cost = setup(batch=4096, context=64, prompt_tokens=64)
    t4 = request.fleet.device("n/gpu1")
    assert cost.limiting_resource(t4, Placement("n/gpu1", 0, 10, 16), 4096) == "compute"


def test_memory_and_kv_tokens():
    request, cost = setup(batch=2)
    t4 = request.fleet.device("n/gpu1")
    memory = cost.memory(t4, Placement("n/gpu1", 0, 10, 8))
    assert memory.capacity_bytes == int(16 * GIB * (1 - cm.RESERVED_FRACTION) - cm.RESERVED_BYTES)
    assert memory.weights_bytes > 10 * 500_000_000  # int8 layers, scales, embedding and head
    assert memory.kv_tokens == memory.free_for_kv // memory.kv_bytes_per_token
    matrix = cost.decode_matrix(t4, 16, 1)
    assert matrix[3, 5] == pytest.approx(cost.decode_s(t4, Placement("n/gpu1", 3, 5, 16), 1))
    assert matrix[0, 10] < float("inf")  # 10 GB of layers, embedding and head fit
    assert matrix[5, 3] == float("inf")  # not a range
    # 64 sequences x 8192 tokens of KV (43 GB) do not: the whole batch"s cache must fit every stage.
    _, crowded = setup(batch=64, context=8192)
    assert crowded.decode_matrix(t4, 16, 1)[0, 10] == float("inf")


def test_hops_use_the_link():
    request, cost = setup()
    a100, t4 = request.fleet.devices
    link = request.fleet.link_between(a100, t4)
    expected = 8 * 2 * 4096 / (link.bandwidth_gbs * 1e9) + link.latency_us * 1e-6
    assert cost.hop_s(a100, t4, 8) == pytest.approx(expected)
